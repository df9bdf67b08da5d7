package provider_test

import (
	"fmt"
	"net/http"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/provider"
)

const (
	reservationAddr  = "takoform_worker_endpoint_origin_reservation.r"
	runtimeInputAddr = "takoform_worker_runtime_input.ri"
	workerAddr       = "takoform_worker.w"
	endpointAddr     = "takoform_worker_endpoint.e"
	activationAddr   = "takoform_worker_endpoint_activation.a"
)

// importSteps are, for one resource, an import by the CLI verified against the state, an import
// block, and (on CLIs that support it) an import block by resource identity.
// The Host does not know a runtime input's bindings_wo_version, so its import block plans
// recording it in place.
func importSteps(cfg, addr, idAttr string, ignore ...string) []resource.TestStep {
	id := func(s *terraform.State) (string, error) {
		rs, ok := s.RootModule().Resources[addr]
		if !ok {
			return "", fmt.Errorf("%s not in state", addr)
		}
		if idAttr == "space/name" {
			return rs.Primary.Attributes["space"] + "/" + rs.Primary.Attributes["name"], nil
		}
		return rs.Primary.Attributes[idAttr], nil
	}
	verifyID := idAttr
	if idAttr == "space/name" {
		verifyID = "name"
	}
	return []resource.TestStep{
		{Config: cfg, ResourceName: addr, ImportState: true, ImportStateIdFunc: id, ImportStateVerify: true,
			ImportStateVerifyIdentifierAttribute: verifyID, ImportStateVerifyIgnore: append([]string{"timeouts"}, ignore...)},
		{Config: cfg, ResourceName: addr, ImportState: true, ImportStateKind: resource.ImportBlockWithID, ImportStateIdFunc: id,
			ExpectNonEmptyPlan: addr == runtimeInputAddr},
		{Config: cfg, ResourceName: addr, ImportState: true, ImportStateKind: resource.ImportBlockWithResourceIdentity, SkipFunc: noIdentity,
			ExpectNonEmptyPlan: addr == runtimeInputAddr},
	}
}

// TestAccFullGraph applies the whole graph, re-plans empty, imports every resource (CLI with
// verification, import block, identity), survives an activation dropped behind its back, and
// destroys in the order the Host accepts; CheckDestroy reads the Host: everything gone, the
// reservation released, tombstones left for every owned object.
func TestAccFullGraph(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config(graph("prod", "hello", "s3cret-value", 1))
	steps := []resource.TestStep{
		{
			Config: cfg,
			ConfigPlanChecks: resource.ConfigPlanChecks{
				PreApply: []plancheck.PlanCheck{
					// Plan-time knowledge: the origin and the reference are known before apply.
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"),
						knownvalue.StringRegexp(regexp.MustCompile(`^http://hello-prod-[0-9a-f]{32}\.workers\.localhost:`+f.h.EdgePort()+`$`))),
					plancheck.ExpectKnownValue(runtimeInputAddr, tfjsonpath.New("reference"),
						knownvalue.StringRegexp(regexp.MustCompile(`^rip2\.c[0-9]{14}-[0-9a-f]{8}\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$`))),
					plancheck.ExpectKnownValue(workerAddr, tfjsonpath.New("runtime_input_reference"),
						knownvalue.StringRegexp(regexp.MustCompile(`^rip2\.`))),
				},
			},
			ConfigStateChecks: []statecheck.StateCheck{
				statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("ready"), knownvalue.Bool(true)),
				statecheck.ExpectKnownValue(activationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
				statecheck.ExpectKnownValue(runtimeInputAddr, tfjsonpath.New("binding_names"), knownvalue.SetExact([]knownvalue.Check{knownvalue.StringExact("GREETING")})),
				statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringRegexp(regexp.MustCompile(`^http://hello-prod-[0-9a-f]{32}\.workers\.localhost:`+f.h.EdgePort()+`/$`))),
			},
			// The URL answers through the runtime's edge, with the delivered secret (its length).
			Check: func(s *terraform.State) error {
				host := s.RootModule().Resources[endpointAddr].Primary.Attributes["hostname"]
				status, body, _ := f.h.Runtime.Get(t, host, "/")
				if status != http.StatusOK || body != fmt.Sprintf("hello, %d", len("s3cret-value")) {
					return fmt.Errorf("%s answered %d %q", host, status, body)
				}
				return nil
			},
		},
		{
			Config:           cfg,
			ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}},
			ConfigStateChecks: []statecheck.StateCheck{
				statecheck.ExpectKnownValue(runtimeInputAddr, tfjsonpath.New("status"), knownvalue.StringExact("settled")),
				statecheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
			},
		},
	}
	steps = append(steps, importSteps(cfg, reservationAddr, "id")...)
	steps = append(steps, importSteps(cfg, runtimeInputAddr, "operation_id", "bindings_wo_version")...)
	steps = append(steps, importSteps(cfg, workerAddr, "space/name")...)
	steps = append(steps, importSteps(cfg, endpointAddr, "space/name")...)
	steps = append(steps, importSteps(cfg, activationAddr, "reservation_id")...)
	steps = append(steps,
		resource.TestStep{
			// Drift: the activation is dropped behind the provider's back; refresh shows it gone
			// and the next apply activates again.
			PreConfig: func() {
				c := ctx(t)
				res, err := f.api.GetReservation(c, provider.DefaultReservationID("prod", "hello", "", ""))
				require.NoError(t, err)
				_, err = f.api.DeleteActivation(c, res.ID, provider.ActivationToken(*res.OwnershipToken, res.Endpoint.UID, 0))
				require.NoError(t, err)
			},
			Config: cfg,
			ConfigPlanChecks: resource.ConfigPlanChecks{
				PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(activationAddr, plancheck.ResourceActionCreate),
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionNoop),
				},
			},
			ConfigStateChecks: []statecheck.StateCheck{
				statecheck.ExpectKnownValue(activationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
			},
		},
		resource.TestStep{Config: cfg, ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
	)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		CheckDestroy:             f.checkGraphDestroyed(t),
		Steps:                    steps,
	})
}

// checkGraphDestroyed reads the Host after a destroy: every object of the destroyed state is
// gone (the Host answers 404 for it, nothing else counts), and each owned one left a tombstone of
// its own key, so a late replay of its requests can never bring it back.
func (f *fixture) checkGraphDestroyed(t *testing.T) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		c := ctx(t)
		for addr, rs := range s.RootModule().Resources {
			a := rs.Primary.Attributes
			var kind, key string
			var err error
			live := true // what the read says, when it answers
			switch rs.Type {
			case "takoform_worker":
				kind, key = "worker", a["space"]+"/"+a["name"]
				_, err = f.api.GetWorker(c, a["space"], a["name"])
			case "takoform_worker_endpoint":
				kind, key = "worker-endpoint", a["space"]+"/"+a["name"]
				_, err = f.api.GetEndpoint(c, a["space"], a["name"])
			case "takoform_worker_endpoint_origin_reservation":
				kind, key = "worker-endpoint-origin-reservation", a["id"]
				_, err = f.api.GetReservation(c, a["id"])
			case "takoform_worker_runtime_input":
				// A destroyed runtime input is aborted, or kept as it ended (settled): its row stays.
				kind, key = "worker-runtime-input-preparation", a["operation_id"]
				var p client.Preparation
				p, err = f.api.GetPreparation(c, a["operation_id"])
				live = p.Status == "prepared" || p.Status == "claimed"
			case "takoform_worker_endpoint_activation":
				// Gone with its reservation, which the case above reads.
				kind, key, live = "worker-endpoint-activation", a["reservation_id"], false
			default:
				continue
			}
			switch {
			case err != nil && !client.IsNotFound(err):
				return fmt.Errorf("%s: reading it after destroy: %w", addr, err)
			case err == nil && live:
				return fmt.Errorf("%s is still present after destroy", addr)
			}
			var tombs int
			if err := f.h.DB.QueryRow(c, `SELECT count(*) FROM ownership_tombstones WHERE organization_id = $1 AND kind = $2 AND external_key = $3`,
				f.h.Organization.ID, kind, key).Scan(&tombs); err != nil {
				return err
			}
			if tombs == 0 {
				return fmt.Errorf("%s left no tombstone for %s %q", addr, kind, key)
			}
		}
		return nil
	}
}
