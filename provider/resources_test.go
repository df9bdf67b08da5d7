package provider_test

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/compare"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/provider"
)

func reservationConfig(subdomain string) string {
	sub := ""
	if subdomain != "" {
		sub = fmt.Sprintf("subdomain = %q", subdomain)
	}
	return fmt.Sprintf(`
resource "takoform_worker_endpoint_origin_reservation" "r" {
  space       = "staging"
  worker_name = "api"
  ttl         = "2h"
  %s
}
`, sub)
}

// TestAccReservation: create with the origin known in the plan, empty re-plan, replace on a new
// subdomain, and a reservation released behind the provider's back is created again.
func TestAccReservation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: f.config(reservationConfig("")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("id"), knownvalue.StringRegexp(regexp.MustCompile(`^res-[0-9a-f]{16}$`))),
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"), knownvalue.StringRegexp(regexp.MustCompile(`^http://api-staging-[0-9a-f]{32}\.workers\.localhost:`+f.h.EdgePort()+`$`))),
				}},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("status"), knownvalue.StringExact("prepared")),
				},
			},
			{Config: f.config(reservationConfig("")), ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
			{
				Config: f.config(reservationConfig("api-v2")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(reservationAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"), knownvalue.StringExact("http://api-v2.workers.localhost:"+f.h.EdgePort())),
				}},
			},
			{
				// Drift: released behind the provider's back; refresh drops it and apply reserves again.
				PreConfig: func() {
					c := ctx(t)
					// The subdomain is part of the default id: the replaced reservation has a new one.
					res, err := f.api.GetReservation(c, provider.DefaultReservationID("staging", "api", "api-v2", ""))
					require.NoError(t, err)
					_, err = f.api.DeleteReservation(c, res.ID, *res.OwnershipToken)
					require.NoError(t, err)
				},
				Config: f.config(reservationConfig("api-v2")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(reservationAddr, plancheck.ResourceActionCreate),
				}},
			},
		},
	})
}

func workerConfig(name, body string) string {
	return fmt.Sprintf(`
resource "takoform_worker" "w" {
  space              = "dev"
  name               = %q
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
}
`, name, body)
}

// TestAccWorker: create, empty re-plan, update in place (a new generation), drift (changed and
// deleted behind the provider's back), import with generated configuration, replace on a rename.
func TestAccWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	v1 := `export default { fetch() { return new Response("v1"); } };`
	v2 := `export default { fetch() { return new Response("v2"); } };`
	sameID := statecheck.CompareValue(compare.ValuesSame())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: f.config(workerConfig("api", v1)),
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("ready"), knownvalue.Bool(true)),
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("generation"), knownvalue.Int64Exact(1)),
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("offering_id"), knownvalue.StringExact("selfhost-module-worker")),
					sameID.AddStateValue(workerAddr, tfjsonpath.New("id")),
				},
			},
			{Config: f.config(workerConfig("api", v1)), ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
			{
				Config:           f.config(workerConfig("api", v2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate)}},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("generation"), knownvalue.Int64Exact(2)),
					sameID.AddStateValue(workerAddr, tfjsonpath.New("id")),
				},
			},
			{
				// Drift: the bundle changed behind the provider's back (by its owner's token).
				PreConfig: func() {
					c := ctx(t)
					w, err := f.api.GetWorker(c, "dev", "api")
					require.NoError(t, err)
					_, _, err = f.api.PutWorker(c, "dev", "api", *w.OwnershipToken, w.Revision, client.WorkerSpec{
						Modules: map[string]string{"index.js": "export default {};"}, MainModule: "index.js", CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}})
					require.NoError(t, err)
				},
				Config:           f.config(workerConfig("api", v2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate)}},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("modules").AtMapKey("index.js"), knownvalue.StringExact(v2)),
				},
			},
			{
				// -generate-config-out: the generated configuration imports with an empty plan.
				Config: f.config(""), ResourceName: workerAddr, ImportState: true,
				ImportStateKind: resource.ImportBlockWithID, ImportStateId: "dev/api", GenerateConfig: true,
			},
			{
				// Drift: deleted behind the provider's back; refresh drops it and apply creates it again.
				PreConfig: func() {
					c := ctx(t)
					w, err := f.api.GetWorker(c, "dev", "api")
					require.NoError(t, err)
					_, err = f.api.DeleteWorker(c, "dev", "api", *w.OwnershipToken)
					require.NoError(t, err)
				},
				Config:           f.config(workerConfig("api", v2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionCreate)}},
			},
			{
				Config:           f.config(workerConfig("api2", v2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionDestroyBeforeCreate)}},
			},
		},
	})
}

func reservationID(space, worker string) string {
	return provider.DefaultReservationID(space, worker, "", "")
}
