package provider_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// moduleWorkers is two workers through examples/modules/worker with for_each, one with a secret
// and one without, as a module author writes it; b's source is given.
func moduleWorkers(t *testing.T, bSource string) string {
	t.Helper()
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

locals {
  workers = {
    a = { source = "export default { fetch() { return new Response('a') } };", secrets = { TOKEN = "module-secret" } }
    b = { source = %q, secrets = {} }
  }
}

module "w" {
  source   = %q
  for_each = local.workers

  space   = "truth"
  name    = each.key
  modules = { "index.js" = each.value.source }
  secrets = each.value.secrets
}
`, bSource, module)
}

func (w *workspace) write(config string) {
	w.t.Helper()
	require.NoError(w.t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(config), 0o600))
}

// A failed deploy is never recorded as landed (issue 13.1): after the apply that fails, the plan
// shows the worker's update again and the apply tries again, until the code is fixed.
func TestAccFailedDeployPlansAgainThroughTheModule(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	const good = "export default { fetch() { return new Response('b') } };"
	const broken = "export default { fetch() { return new Response('b' };"
	w := newWorkspace(t, h.URL, h.Key, moduleWorkers(t, good))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)

	w.write(moduleWorkers(t, broken))
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "deployment_failed")
	require.Contains(t, out, "SyntaxError", "the diagnostic carries workerd's own message")

	// The old code serves; the plan does not pretend the new code does.
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.Error(t, err, "the plan after a failed deploy must show the change:\n%s", out)
	require.Contains(t, out, `module.w["b"].takoform_worker.this will be updated in-place`)
	require.NotContains(t, out, `module.w["a"].takoform_worker.this will be`, "the worker that landed stays as it is")
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.Error(t, err, "a re-run on the broken code must fail again:\n%s", out)
	require.Contains(t, out, "deployment_failed")

	w.write(moduleWorkers(t, good))
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty after the fix:\n%s", out)
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
}

// An update whose change landed while the Host stopped before answering meets its own change as
// revision_conflict when the client retries it: that is success, not the user's fault (issue
// 13.6). A proxy stands in for the Host that stopped: the first update is written straight into
// the database, as an interrupted update leaves it, and answered 503.
func TestAccRetriedUpdateMeetingItsOwnLandedChangeSucceeds(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const v2 = `export default { fetch() { return new Response("v2") } };`
	u, err := url.Parse(f.h.URL)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	var interrupted atomic.Bool
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.URL.Path == "/v1/spaces/retry/workers/hello" && r.Header.Get("If-Match") != "" && interrupted.CompareAndSwap(false, true) {
			modules, _ := json.Marshal(map[string]string{"index.js": v2})
			if _, err := f.h.DB.Exec(context.Background(), `UPDATE workers SET modules = $1, revision = revision + 1 WHERE space = 'retry' AND name = 'hello'`, modules); err != nil {
				http.Error(w, err.Error(), http.StatusInternalServerError)
				return
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"urn:takoform:problem:unavailable","title":"Unavailable","status":503,"code":"unavailable","detail":"the Host is stopping"}`))
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)
	cfg := func(source string) string {
		return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {
  endpoint        = %q
  api_key         = %q
  organization_id = %q
}

resource "takoform_worker" "w" {
  space              = "retry"
  name               = "hello"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
}
`, proxy.URL, f.h.Key, f.h.Organization.ID, source)
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{Config: cfg(workerSource)},
			{
				Config: cfg(v2),
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("takoform_worker.w", tfjsonpath.New("modules").AtMapKey("index.js"), knownvalue.StringExact(v2)),
				},
				Check: func(*terraform.State) error {
					if !interrupted.Load() {
						return fmt.Errorf("the update was never interrupted")
					}
					return nil
				},
			},
		},
	})
}

// oneWorker is one worker through examples/modules/worker, with a pinned subdomain.
func oneWorker(t *testing.T, name, subdomain string) string {
	t.Helper()
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

module "w" {
  source    = %q
  space     = "moves"
  name      = %q
  subdomain = %q
  modules   = { "index.js" = "export default { fetch() { return new Response('%s') } };" }
  secrets   = { TOKEN = "moving-secret" }
}

output "url" {
  value = module.w.url
}
`, module, name, subdomain, name)
}

// answersAt fetches the module's url output through the runtime's edge.
func answersAt(t *testing.T, w *workspace, h *testhost.Host, want string) {
	t.Helper()
	out, err := w.run("output", "-raw", "url")
	require.NoError(t, err, out)
	host := strings.TrimSuffix(strings.TrimPrefix(out, "http://"), ":"+h.EdgePort()+"/")
	status, body, _ := h.Runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, want, body)
}

func (w *workspace) apply(config string) string {
	w.t.Helper()
	w.write(config)
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(w.t, err, out)
	out2, err := w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(w.t, err, "re-plan is empty:\n%s", out2)
	return out
}

// A subdomain change, and a rename that keeps a pinned subdomain, each apply in one run (issue
// 13.2 and 13.3): the reservation's default id follows its subdomain, so the endpoint standing on
// it is replaced with it in an order the Host accepts; the plan-time check says when the origin is
// held by this organization's own reservation instead of refusing the plan.
func TestAccSubdomainChangeAndRenameApplyInOneRun(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	w := newWorkspace(t, h.URL, h.Key, oneWorker(t, "first", "sub-one"))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	w.apply(oneWorker(t, "first", "sub-one"))
	answersAt(t, w, h, "first")

	out = w.apply(oneWorker(t, "first", "sub-two"))
	answersAt(t, w, h, "first")
	status, _, _ := h.Runtime.Get(t, "sub-one.workers.localhost", "/")
	require.Equal(t, http.StatusNotFound, status, "the old origin no longer answers")

	w.apply(oneWorker(t, "second", "sub-two"))
	answersAt(t, w, h, "second")

	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
}

// Two instances wanting one subdomain: the second fails at apply (origin_taken), and destroy is
// not blocked by the plan-time check of the instance that was never created (issue 13.4).
func TestAccDestroyIsNotBlockedByAnAvailabilityCheck(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	config := fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

module "w" {
  source    = %q
  for_each  = toset(["one", "two"])
  space     = "clash"
  name      = each.key
  subdomain = "clash"
  modules   = { "index.js" = "export default { fetch() { return new Response('x') } };" }
}
`, module)
	w := newWorkspace(t, h.URL, h.Key, config)
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color", "-parallelism=1")
	require.Error(t, err, out)
	require.Contains(t, out, "origin_taken")
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.NotContains(t, string(state), `"takoform_worker_endpoint_origin_reservation"`, "destroy left a reservation in the state")
}

// The derivation says whose hold an unavailable origin meets: the organization's own reservation by
// id, another organization by nothing more (the plan-time diagnostics rest on it).
func TestAccDerivationSaysWhoHoldsAnOrigin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	sub := "pinned"
	_, _, err := f.api.PutReservation(ctx(t), "res-old", "token-old-0123456789", client.ReservationRequest{Space: "prod", WorkerName: "first", Subdomain: &sub})
	require.NoError(t, err)
	id := "res-new"
	d, err := f.api.Derive(ctx(t), client.DerivationRequest{Space: "prod", WorkerName: "second", Subdomain: &sub, OriginReservationID: &id})
	require.NoError(t, err)
	require.False(t, d.Available)
	require.Equal(t, &client.Holder{Organization: "self", Kind: "reservation", Name: "res-old"}, d.HeldBy)

	other, err := client.New(client.Config{Endpoint: f.h.URL, APIKey: f.h.NewKey(t, "globex")})
	require.NoError(t, err)
	d, err = other.Derive(ctx(t), client.DerivationRequest{Space: "prod", WorkerName: "second", Subdomain: &sub, OriginReservationID: &id})
	require.NoError(t, err)
	require.False(t, d.Available)
	require.Equal(t, &client.Holder{Organization: "other"}, d.HeldBy, "another organization's hold is named by nothing more")
}

// What the Host would refuse at apply fails at plan, all at once and in HCL names (issue 13.5): a
// main_module that is not a module, a compatibility_date in the future, a bundle over the limit.
func TestAccBadWorkerInputsFailAtPlanAllAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	big := strings.Repeat("x", 1<<20)
	bad := f.config(fmt.Sprintf(`
resource "takoform_worker" "w" {
  space              = "bad"
  name               = "inputs"
  main_module        = "main.js"
  modules            = { "index.js" = "export default {}; // %s" }
  compatibility_date = "2999-01-01"
}
`, big))
	// One plan reports all three; each step looks for one of them in that plan's output.
	var steps []resource.TestStep
	for _, want := range []string{`(?s)Bundle too large.*at most\s+1032192`, `main_module is not one of the modules`, `compatibility_date in the future`} {
		steps = append(steps, resource.TestStep{Config: bad, PlanOnly: true, ExpectError: regexp.MustCompile(want)})
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: append(steps, resource.TestStep{
			Config: f.config(`
resource "takoform_worker" "w" {
  space              = "bad"
  name               = "inputs"
  main_module        = "index.js"
  modules            = { "index.js" = "export default {};" }
  compatibility_date = "2025-02-30"
}
`),
			PlanOnly:    true,
			ExpectError: regexp.MustCompile(`Invalid compatibility_date`),
		}, resource.TestStep{
			Config: f.config(`
resource "takoform_worker" "w" {
  space              = "bad"
  name               = "inputs"
  main_module        = "index.js"
  module_files       = { "index.js" = "no/such/dir/index.js" }
  compatibility_date = "2025-01-01"
}
`),
			PlanOnly:    true,
			ExpectError: regexp.MustCompile(`(?s)Unable to read a module file.*module_files.*Module "index.js" names the file`),
		}, resource.TestStep{
			Config: f.config(`
resource "takoform_worker" "w" {
  space              = "bad"
  name               = "inputs"
  main_module        = "index.js"
  modules            = { "index.js" = "export default {};" }
  module_files       = { "index.js" = "index.js" }
  compatibility_date = "2025-01-01"
}
`),
			PlanOnly:    true,
			ExpectError: regexp.MustCompile(`(?s)Invalid Attribute Combination.*modules.*module_files`),
		}),
	})
}

// A worker requiring a secret its runtime input does not bind fails at plan, naming both sides
// (issue 13.5), whether the runtime input is planned in the same run or exists already.
func TestAccWorkerRequiringAnUnboundSecretFailsAtPlan(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	good := graph("unbound", "hello", "v", 1)
	bad := strings.Replace(good, `required_sensitive_vars = ["GREETING"]`, `required_sensitive_vars = ["GREETING", "MISSING"]`, 1)
	require.NotEqual(t, good, bad)
	want := regexp.MustCompile(`(?s)Secrets the runtime input does not bind.*requires \[GREETING,\s+MISSING\].*binds\s+\[GREETING\]`)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{Config: f.config(bad), PlanOnly: true, ExpectError: want},
			{Config: f.config(good)},
			{Config: f.config(bad), PlanOnly: true, ExpectError: want},
		},
	})
}
