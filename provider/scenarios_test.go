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
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// TestAccIdentities: every resource of the graph declares its identity (CLIs >= 1.12).
func TestAccIdentities(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	anything := knownvalue.NotNull()
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		TerraformVersionChecks:   identityCLIs,
		Steps: []resource.TestStep{{
			Config: f.config(graph("ids", "hello", "v", 1)),
			ConfigStateChecks: []statecheck.StateCheck{
				statecheck.ExpectIdentity(reservationAddr, map[string]knownvalue.Check{"id": knownvalue.StringExact(reservationID("ids", "hello"))}),
				statecheck.ExpectIdentity(runtimeInputAddr, map[string]knownvalue.Check{"operation_id": anything}),
				statecheck.ExpectIdentity(workerAddr, map[string]knownvalue.Check{"space": knownvalue.StringExact("ids"), "name": knownvalue.StringExact("hello")}),
				statecheck.ExpectIdentity(endpointAddr, map[string]knownvalue.Check{"space": knownvalue.StringExact("ids"), "name": knownvalue.StringExact("hello")}),
				statecheck.ExpectIdentity(activationAddr, map[string]knownvalue.Check{"reservation_id": knownvalue.StringExact(reservationID("ids", "hello"))}),
			},
		}},
	})
}

// TestAccRotation: bumping bindings_wo_version replaces the runtime input (a new nonce, so a new
// reference for the same values) and updates the worker in place, which consumes it.
func TestAccRotation(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sameWorker := statecheck.CompareValue(compare.ValuesSame())
	newReference := statecheck.CompareValue(compare.ValuesDiffer())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: f.config(graph("rot", "hello", "same-value", 1)),
				ConfigStateChecks: []statecheck.StateCheck{
					sameWorker.AddStateValue(workerAddr, tfjsonpath.New("id")),
					newReference.AddStateValue(runtimeInputAddr, tfjsonpath.New("reference")),
				},
			},
			{
				Config: f.config(graph("rot", "hello", "same-value", 2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(runtimeInputAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionNoop),
					plancheck.ExpectKnownValue(workerAddr, tfjsonpath.New("runtime_input_reference"), knownvalue.StringRegexp(regexp.MustCompile(`^rip2\.`))),
				}},
				ConfigStateChecks: []statecheck.StateCheck{
					sameWorker.AddStateValue(workerAddr, tfjsonpath.New("id")),
					newReference.AddStateValue(runtimeInputAddr, tfjsonpath.New("reference")),
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("ready"), knownvalue.Bool(true)),
				},
			},
			{
				Config:            f.config(graph("rot", "hello", "same-value", 2)),
				ConfigPlanChecks:  resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}},
				ConfigStateChecks: []statecheck.StateCheck{statecheck.ExpectKnownValue(runtimeInputAddr, tfjsonpath.New("status"), knownvalue.StringExact("settled"))},
			},
			{
				// New values without a version bump replace the runtime input as well.
				Config: f.config(graph("rot", "hello", "another-value", 2)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(runtimeInputAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate),
				}},
			},
		},
	})
}

// TestAccWorkerReplace: replacing the worker (a taint, as `apply -replace` does) without its
// runtime input fails at plan with SPEC 4's diagnostic; replacing both converges in one apply,
// replaces the endpoint and activation with the worker, and keeps the reservation and origin.
func TestAccWorkerReplace(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config(graph("rep", "hello", "v", 1))
	sameOrigin := statecheck.CompareValue(compare.ValuesSame())
	otherWorker := statecheck.CompareValue(compare.ValuesDiffer())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		CheckDestroy:             f.checkGraphDestroyed(t),
		Steps: []resource.TestStep{
			{
				Config: cfg,
				ConfigStateChecks: []statecheck.StateCheck{
					sameOrigin.AddStateValue(reservationAddr, tfjsonpath.New("canonical_origin")),
					otherWorker.AddStateValue(workerAddr, tfjsonpath.New("id")),
				},
			},
			{
				Config:      cfg,
				Taint:       []string{workerAddr},
				ExpectError: regexp.MustCompile(`(?s)Runtime input delivered to another worker.*replace the\s+takoform_worker_runtime_input too`),
			},
			{
				Config: cfg,
				Taint:  []string{workerAddr, runtimeInputAddr},
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(runtimeInputAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(activationAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(reservationAddr, plancheck.ResourceActionNoop),
				}},
				ConfigStateChecks: []statecheck.StateCheck{
					sameOrigin.AddStateValue(reservationAddr, tfjsonpath.New("canonical_origin")),
					otherWorker.AddStateValue(workerAddr, tfjsonpath.New("id")),
					statecheck.ExpectKnownValue(activationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
				},
			},
			{Config: cfg, ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
		},
	})
}

func hostMintedConfig() string {
	return fmt.Sprintf(`
resource "takoform_worker" "w" {
  space              = "mint"
  name               = "hello"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
}

resource "takoform_worker_endpoint" "e" {
  space     = "mint"
  name      = "hello"
  worker    = takoform_worker.w.name
  worker_id = takoform_worker.w.id
}
`, workerSource)
}

// TestAccHostMinted: an endpoint without a reservation publishes through one the Host mints; an
// endpoint deleted behind the provider's back is created again; destroy and re-apply get the
// same Host-minted origin.
func TestAccHostMinted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sameURL := statecheck.CompareValue(compare.ValuesSame())
	cfg := f.config(hostMintedConfig())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: cfg,
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("host_minted"), knownvalue.Bool(true)),
					statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("origin_reservation_id"), knownvalue.StringRegexp(regexp.MustCompile(`^hostmint-[0-9a-f]{40}$`))),
					sameURL.AddStateValue(endpointAddr, tfjsonpath.New("url")),
				},
			},
			{Config: cfg, ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
			{
				Config: cfg + `
data "takoform_worker_endpoint_origin_reservation" "minted" {
  id = takoform_worker_endpoint.e.origin_reservation_id
}

data "takoform_worker" "w" {
  space = "mint"
  name  = takoform_worker.w.name
}
`,
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("data.takoform_worker_endpoint_origin_reservation.minted", tfjsonpath.New("host_minted"), knownvalue.Bool(true)),
					statecheck.ExpectKnownValue("data.takoform_worker_endpoint_origin_reservation.minted", tfjsonpath.New("status"), knownvalue.StringExact("activated")),
					statecheck.ExpectKnownValue("data.takoform_worker.w", tfjsonpath.New("ready"), knownvalue.Bool(true)),
				},
			},
			{
				PreConfig: func() {
					c := ctx(t)
					e, err := f.api.GetEndpoint(c, "mint", "hello")
					require.NoError(t, err)
					_, err = f.api.DeleteEndpoint(c, "mint", "hello", *e.OwnershipToken)
					require.NoError(t, err)
				},
				Config:           cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionCreate)}},
				ConfigStateChecks: []statecheck.StateCheck{
					sameURL.AddStateValue(endpointAddr, tfjsonpath.New("url")),
				},
			},
			{Config: cfg, Destroy: true},
			{
				Config: cfg,
				ConfigStateChecks: []statecheck.StateCheck{
					sameURL.AddStateValue(endpointAddr, tfjsonpath.New("url")),
				},
			},
		},
	})
}

// TestAccForeignHeldOriginFailsAtPlan: a reservation for an origin another organization holds
// fails at plan, naming the origin, and nothing is created.
func TestAccForeignHeldOriginFailsAtPlan(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	other, err := client.New(client.Config{Endpoint: f.h.URL, APIKey: f.h.NewKey(t, "globex")})
	require.NoError(t, err)
	sub := "shared"
	_, _, err = other.PutReservation(ctx(t), "res-globex", "globex-token-0123456789", client.ReservationRequest{Space: "prod", WorkerName: "site", Subdomain: &sub})
	require.NoError(t, err)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: f.config(`
resource "takoform_worker_endpoint_origin_reservation" "r" {
  id          = "res-mine"
  space       = "prod"
  worker_name = "site"
  subdomain   = "shared"
}
`),
			PlanOnly:    true,
			ExpectError: regexp.MustCompile(`(?s)Origin not available.*http://shared\.workers\.localhost:` + f.h.EdgePort() + `.*held by another\s+organization`),
		}},
		CheckDestroy: func(*terraform.State) error {
			if _, err := f.api.GetReservation(ctx(t), "res-mine"); !client.IsNotFound(err) {
				return fmt.Errorf("a reservation was created: %v", err)
			}
			return nil
		},
	})
}

// TestAccOwnershipConflictNamesTheImport: creating what another token owns fails with the exact
// import block and command that adopt it.
func TestAccOwnershipConflictNamesTheImport(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, _, err := f.api.PutWorker(ctx(t), "dev", "taken", "someone-elses-token-0001", 0, client.WorkerSpec{
		Modules: map[string]string{"index.js": workerSource}, MainModule: "index.js", CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}})
	require.NoError(t, err)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config:      f.config(workerConfig("taken", workerSource)),
			ExpectError: regexp.MustCompile(`(?s)Unable to create worker.*ownership_conflict.*import \{\s+to = takoform_worker.<name>\s+id = "dev/taken"\s+\}.*import takoform_worker.<name> dev/taken`),
		}},
	})
}
