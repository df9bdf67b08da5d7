package provider_test

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"
)

// TestAccFullGraph applies the whole graph, re-plans empty, and destroys it in the order the Host
// accepts; CheckDestroy reads the Host: everything gone, the reservation released, tombstones
// left for every owned object.
func TestAccFullGraph(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config(graph("prod", "hello", "s3cret-value", 1))
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		CheckDestroy: func(s *terraform.State) error {
			c := ctx(t)
			if _, err := f.api.GetWorker(c, "prod", "hello"); err == nil {
				return fmt.Errorf("worker still present")
			}
			if _, err := f.api.GetEndpoint(c, "prod", "hello"); err == nil {
				return fmt.Errorf("endpoint still present")
			}
			for _, rs := range s.RootModule().Resources {
				if rs.Type == "takoform_worker_endpoint_origin_reservation" {
					if _, err := f.api.GetReservation(c, rs.Primary.ID); err == nil {
						return fmt.Errorf("reservation %s still held", rs.Primary.ID)
					}
				}
			}
			var tombs int
			if err := f.h.DB.QueryRow(c, `SELECT count(*) FROM ownership_tombstones WHERE organization_id = $1`, f.h.Organization.ID).Scan(&tombs); err != nil {
				return err
			}
			if tombs < 5 {
				return fmt.Errorf("%d tombstones, want one per owned object (5)", tombs)
			}
			return nil
		},
		Steps: []resource.TestStep{
			{
				Config: cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{
					PreApply: []plancheck.PlanCheck{
						// Plan-time knowledge: the origin and the reference are known before apply.
						plancheck.ExpectKnownValue("takoform_worker_endpoint_origin_reservation.r", tfjsonpath.New("canonical_origin"),
							knownvalue.StringRegexp(regexp.MustCompile(`^http://hello-prod-[0-9a-f]{8}\.workers\.localhost:8787$`))),
						plancheck.ExpectKnownValue("takoform_worker_runtime_input.ri", tfjsonpath.New("reference"),
							knownvalue.StringRegexp(regexp.MustCompile(`^rip1\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$`))),
						plancheck.ExpectKnownValue("takoform_worker.w", tfjsonpath.New("runtime_input_reference"),
							knownvalue.StringRegexp(regexp.MustCompile(`^rip1\.`))),
					},
				},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("takoform_worker.w", tfjsonpath.New("ready"), knownvalue.Bool(true)),
					statecheck.ExpectKnownValue("takoform_worker_endpoint_activation.a", tfjsonpath.New("status"), knownvalue.StringExact("activated")),
					statecheck.ExpectKnownValue("takoform_worker_runtime_input.ri", tfjsonpath.New("status"), knownvalue.StringExact("prepared")),
					statecheck.ExpectKnownOutputValue("url", knownvalue.StringRegexp(regexp.MustCompile(`^http://hello-prod-[0-9a-f]{8}\.workers\.localhost:8787/$`))),
				},
			},
			{
				Config: cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{
					PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()},
				},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("takoform_worker_runtime_input.ri", tfjsonpath.New("status"), knownvalue.StringExact("settled")),
					statecheck.ExpectKnownValue("takoform_worker_endpoint_origin_reservation.r", tfjsonpath.New("status"), knownvalue.StringExact("activated")),
				},
			},
		},
	})
	require.True(t, true)
}
