package provider_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/compare"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

const (
	calleeAddr = "takoform_worker.auth"
	callerAddr = "takoform_worker.api"
	callerEP   = "takoform_worker_endpoint.api"
)

// bindingGraph is a callee, a caller that answers with the callee's reply through its AUTH
// binding, and the caller's Host-minted endpoint.
func bindingGraph(calleeReply string) string { return bindingGraphTo(calleeReply, "auth") }

// bindingGraphTo is bindingGraph with the caller bound to target (auth, or auth2 beside it).
func bindingGraphTo(calleeReply, target string) string {
	callee := `export default { fetch() { return new Response("` + calleeReply + `"); } };`
	other := `export default { fetch() { return new Response("auth2"); } };`
	caller := `export default { async fetch(req, env) { const r = await env.AUTH.fetch("http://auth/"); return new Response("via binding " + r.status + ": " + await r.text()); } };`
	return strings.ReplaceAll(fmt.Sprintf(`
resource "takoform_worker" "auth" {
  space              = "sb"
  name               = "auth"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
}

resource "takoform_worker" "auth2" {
  space              = "sb"
  name               = "auth2"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
}

resource "takoform_worker" "api" {
  space              = "sb"
  name               = "api"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
  service_bindings   = { AUTH = takoform_worker.TARGET.id }
}

resource "takoform_worker_endpoint" "api" {
  space     = "sb"
  name      = "api"
  worker    = takoform_worker.api.name
  worker_id = takoform_worker.api.id
}
`, callee, other, caller), "TARGET", target)
}

func callerAnswers(t *testing.T, f *fixture, want string) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		host := s.RootModule().Resources[callerEP].Primary.Attributes["hostname"]
		status, body, _ := f.h.Runtime.Get(t, host, "/")
		if status != http.StatusOK || body != want {
			return fmt.Errorf("%s answered %d %q, want %q", host, status, body, want)
		}
		return nil
	}
}

// TestAccServiceBindings: a caller answers with its callee's reply through a service binding at
// its URL; the callee's code update is an update of the callee alone and reaches the caller; a
// delete of the callee out of order is refused by the Host naming the caller; -replace of the
// callee replaces the caller with it in one apply; destroy succeeds in the plan's order. The
// framework re-plans after every step and fails on any diff.
func TestAccServiceBindings(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	v1, v2 := f.config(bindingGraph("auth v1")), f.config(bindingGraph("auth v2"))
	otherCallee := statecheck.CompareValue(compare.ValuesDiffer())
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		CheckDestroy: func(*terraform.State) error {
			for _, name := range []string{"api", "auth", "auth2"} {
				if _, err := f.api.GetWorker(ctx(t), "sb", name); !client.IsNotFound(err) {
					return fmt.Errorf("worker sb/%s is still there after destroy (%v)", name, err)
				}
			}
			return nil
		},
		Steps: []resource.TestStep{
			{
				Config:            v1,
				Check:             callerAnswers(t, f, "via binding 200: auth v1"),
				ConfigStateChecks: []statecheck.StateCheck{otherCallee.AddStateValue(calleeAddr, tfjsonpath.New("id"))},
			},
			{
				Config:      strings.Replace(v1, `service_bindings   = { AUTH = takoform_worker.auth.id }`, `service_bindings   = { AUTH = takoform_worker.auth.id }`+"\n  vars = { AUTH = \"x\" }", 1),
				PlanOnly:    true,
				ExpectError: regexp.MustCompile(`(?s)service_bindings name "AUTH" is also a var`),
			},
			{
				Config: v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(calleeAddr, plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction(callerAddr, plancheck.ResourceActionNoop),
					plancheck.ExpectResourceAction(callerEP, plancheck.ResourceActionNoop),
				}},
				Check: callerAnswers(t, f, "via binding 200: auth v2"),
			},
			{
				// Out of order, behind the provider's back: the Host refuses and names the caller.
				PreConfig: func() {
					c := ctx(t)
					w, err := f.api.GetWorker(c, "sb", "auth")
					require.NoError(t, err)
					_, err = f.api.DeleteWorker(c, "sb", "auth", *w.OwnershipToken)
					require.True(t, client.IsCode(err, "worker_has_callers"), "the delete answered %v", err)
					require.ErrorContains(t, err, "sb/api")
				},
				Config:           v2,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}},
			},
			{
				Config: v2,
				Taint:  []string{calleeAddr},
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(calleeAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(callerAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(callerEP, plancheck.ResourceActionDestroyBeforeCreate),
				}},
				ConfigStateChecks: []statecheck.StateCheck{otherCallee.AddStateValue(calleeAddr, tfjsonpath.New("id"))},
				Check:             callerAnswers(t, f, "via binding 200: auth v2"),
			},
			{Config: v2, ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
			{
				// Moved to another existing worker: in place.
				Config: f.config(bindingGraphTo("auth v2", "auth2")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(callerAddr, plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction(callerEP, plancheck.ResourceActionNoop),
				}},
				Check: callerAnswers(t, f, "via binding 200: auth2"),
			},
		},
	})
}

// TestAccWorkerLimits: a worker past its cpu_ms ends its request with 504 at its URL; raising the
// limit is an update in place after which the request finishes; a limit above the offering's
// ceiling fails at plan.
func TestAccWorkerLimits(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	slow := `export default { async fetch() { await new Promise(r => setTimeout(r, 1000)); return new Response("done"); } };`
	cfg := func(limits string) string {
		return f.config(fmt.Sprintf(`
resource "takoform_worker" "w" {
  space              = "lim"
  name               = "slow"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
  limits             = %s
}

data "takoform_offerings" "all" {}

resource "takoform_worker_endpoint" "e" {
  space     = "lim"
  name      = "slow"
  worker    = takoform_worker.w.name
  worker_id = takoform_worker.w.id
}
`, slow, limits))
	}
	answers := func(wantStatus int) resource.TestCheckFunc {
		return func(s *terraform.State) error {
			host := s.RootModule().Resources[endpointAddr].Primary.Attributes["hostname"]
			status, body, _ := f.h.Runtime.Get(t, host, "/")
			if status != wantStatus {
				return fmt.Errorf("%s answered %d %q, want %d", host, status, body, wantStatus)
			}
			return nil
		}
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: cfg(`{ cpu_ms = 300, memory_mb = 128 }`),
				Check: resource.ComposeAggregateTestCheckFunc(answers(http.StatusGatewayTimeout),
					resource.TestCheckTypeSetElemNestedAttrs("data.takoform_offerings.all", "offerings.*",
						map[string]string{"id": "selfhost-module-worker", "max_cpu_ms": "2000", "max_memory_mb": "128", "keeps_logs": "true"})),
			},
			{
				Config: cfg(`{ cpu_ms = 2000, memory_mb = 128 }`),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionNoop),
				}},
				Check: answers(http.StatusOK),
			},
			{
				Config:      cfg(`{ cpu_ms = 2001 }`),
				PlanOnly:    true,
				ExpectError: regexp.MustCompile(`(?s)Limit outside the offering's ceilings.*cpu_ms 2001 is above this\s+offering's\s+ceiling\s+of\s+2000\s+\(offering\s+selfhost-module-worker\)`),
			},
			{
				Config:      cfg(`{ memory_mb = 256 }`),
				PlanOnly:    true,
				ExpectError: regexp.MustCompile(`(?s)memory_mb\s+must\s+be\s+128\s+on\s+this\s+offering`),
			},
		},
	})
}
