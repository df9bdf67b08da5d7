package provider_test

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// These tests run the built provider binary under the CLI directly (dev_overrides), as a module
// author would, for what terraform-plugin-testing cannot show: the CLI's own output, the state
// file and the TRACE log.

// requireCLI returns the CLI of this process, skipping (or failing under CI) without one.
func requireCLI(t *testing.T) cli {
	t.Helper()
	if accCLI.path == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("no CLI for acceptance tests (CI=true never skips them)")
		}
		t.Skip("no OpenTofu or terraform: run tools/opentofu.sh")
	}
	return accCLI
}

// workspace is a directory with a configuration, a CLI config with dev_overrides, and the
// environment to run a CLI in it.
type workspace struct {
	t   *testing.T
	cli cli
	dir string
	env []string
}

func newWorkspace(t *testing.T, endpoint, apiKey, config string, extraEnv ...string) *workspace {
	t.Helper()
	c := requireCLI(t)
	dir := t.TempDir()
	rc := filepath.Join(dir, "cli.tfrc")
	require.NoError(t, os.WriteFile(rc, []byte(fmt.Sprintf(`provider_installation {
  dev_overrides {
    "takoform/takoform" = %q
  }
  direct {}
}
`, providerDir)), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "main.tf"), []byte(config), 0o600))
	env := append(os.Environ(),
		"TF_CLI_CONFIG_FILE="+rc,
		"TF_IN_AUTOMATION=1",
		"CHECKPOINT_DISABLE=1",
		"TAKOFORM_ENDPOINT="+endpoint,
		"TAKOFORM_API_KEY="+apiKey,
	)
	env = append(env, extraEnv...)
	return &workspace{t: t, cli: c, dir: dir, env: env}
}

func (w *workspace) run(args ...string) (string, error) {
	w.t.Helper()
	cmd := exec.Command(w.cli.path, args...)
	cmd.Dir = w.dir
	cmd.Env = w.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// cliProviderBlock is a configuration's provider requirement and an empty provider block: the
// provider takes its endpoint and key from the workspace's environment.
const cliProviderBlock = `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}
`

const offeringsConfig = `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

data "takoform_offerings" "all" {}

output "offering_ids" {
  value = [for o in data.takoform_offerings.all.offerings : o.id]
}
`

func TestAccOfferingsDataSourceReadsTheCatalog(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	w := newWorkspace(t, h.URL, h.Key, offeringsConfig)
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	raw, err := w.run("output", "-json", "offering_ids")
	require.NoError(t, err, raw)
	var ids []string
	require.NoError(t, json.Unmarshal([]byte(raw), &ids), raw)
	require.Equal(t, []string{"selfhost-module-worker", "selfhost-worker-endpoint"}, ids)

	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.NotContains(t, string(state), h.Key, "the API key never reaches state")
	require.NotContains(t, out, h.Key, "nor the CLI output")
}

func TestAccBadKeyIsAClearError(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	bogus := "tkf_" + strings.Repeat("a", 52)
	w := newWorkspace(t, h.URL, bogus, offeringsConfig)
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.Error(t, err)
	require.Contains(t, out, "Unable to read offerings")
	require.Contains(t, out, "unauthenticated")
	require.NotContains(t, out, bogus)
}

func TestAccMissingEndpointIsAClearError(t *testing.T) {
	t.Parallel()
	w := newWorkspace(t, "", "tkf_x", offeringsConfig)
	out, err := w.run("plan", "-input=false", "-no-color")
	require.Error(t, err)
	require.Contains(t, out, "Unable to configure the Takoform provider")
	require.Contains(t, out, "TAKOFORM_ENDPOINT")
}

// TestAccSecretCanaryIsNowhere: a secret given in bindings_wo appears nowhere, in plain or under
// nested base64 or hex: not in the plan JSON, the state file, the resources' private state, the
// CLI's output, the TRACE log of the CLI and the provider, or the Host's debug log.
func TestAccSecretCanaryIsNowhere(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	canary := "canary-" + strings.Repeat("7f3a", 6)
	config := `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

# As a module author would pass a secret: an ephemeral variable, which no plan or state keeps.
variable "greeting" {
  type      = string
  sensitive = true
  ephemeral = true
}
` + strings.Replace(graph("canary", "hello", canary, 1), `"`+canary+`"`, "var.greeting", 1)
	logPath := filepath.Join(t.TempDir(), "trace.log")
	w := newWorkspace(t, h.URL, h.Key, config, "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID, "TF_LOG=TRACE", "TF_LOG_PATH="+logPath,
		"TF_VAR_greeting="+canary)
	var outputs []string
	step := func(args ...string) string {
		out, err := w.run(args...)
		require.NoError(t, err, out)
		outputs = append(outputs, out)
		return out
	}
	step("plan", "-input=false", "-no-color", "-out=tfplan")
	planJSON := step("show", "-json", "tfplan")
	// What the plan holds lets nobody test guesses of the value (SPEC 3.5, rip2): the guess that
	// is right matches nothing an attacker without a write key can compute.
	input := plannedRuntimeInput(t, planJSON)
	require.Empty(t, guessFromPlan(input, []string{"hunter2", "password", canary, "hello"}), "a guess of the secret was confirmed from the saved plan")
	require.Contains(t, planJSON, "rip2.", "the plan carries the reference")
	// The commitment key (which a write key gets) and each value's HMAC under it are nowhere.
	c, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key})
	require.NoError(t, err)
	secretID, key, err := c.CommitmentKey(t.Context(), input.nonce)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(input.reference, "rip2."+secretID+"."), input.reference)
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(`{"name":"GREETING","value":"` + canary + `"}`))
	keyForms := []string{hex.EncodeToString(key), base64.StdEncoding.EncodeToString(key), hex.EncodeToString(mac.Sum(nil))}
	step("apply", "-input=false", "-no-color", "tfplan")
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.Contains(t, string(state), `"ready": true`, "the worker consumed the runtime input and is Ready")
	step("plan", "-input=false", "-no-color", "-detailed-exitcode")
	step("destroy", "-auto-approve", "-input=false", "-no-color")
	trace, err := os.ReadFile(logPath)
	require.NoError(t, err)
	require.Contains(t, string(trace), "request to the Host answered", "the provider's own TRACE lines are in the log")

	private := privateStates(t, state)
	require.NotEmpty(t, private, "the resources keep private state (their ownership tokens), so its scan means something")
	for what, text := range map[string]string{
		"plan JSON": planJSON, "state file": string(state), "private state": private, "CLI output": strings.Join(outputs, "\n"),
		"TRACE log": string(trace), "Host log": h.Logs(),
	} {
		// Plain, or under nested base64 (std, URL, raw) and hex: a provider that wrote the
		// bindings into private state would leave base64 of base64 in the state file.
		if chain, found := leakscan.FindString(text, canary); found {
			t.Errorf("the secret leaked into the %s (encoded as %q)", what, chain)
		}
		require.NotContains(t, text, h.Key, "the API key leaked into the %s", what)
		for _, f := range keyForms {
			require.NotContains(t, text, f, "the commitment key, or a value's HMAC under it, is in the %s", what)
		}
	}
}

// plannedInput is what a saved plan shows of a runtime input: everything its reference is
// computed from except the values.
type plannedInput struct {
	reference, nonce string
	target           runtimeref.Target
}

func plannedRuntimeInput(t *testing.T, planJSON string) plannedInput {
	t.Helper()
	var plan struct {
		PlannedValues struct {
			RootModule struct {
				Resources []struct {
					Type   string         `json:"type"`
					Values map[string]any `json:"values"`
				} `json:"resources"`
			} `json:"root_module"`
		} `json:"planned_values"`
	}
	require.NoError(t, json.Unmarshal([]byte(planJSON), &plan))
	for _, r := range plan.PlannedValues.RootModule.Resources {
		if r.Type != "takoform_worker_runtime_input" {
			continue
		}
		v := func(k string) string { s, _ := r.Values[k].(string); return s }
		return plannedInput{reference: v("reference"), nonce: v("material_set_nonce"), target: runtimeref.Target{
			Space: v("space"), WorkerName: v("worker_name"), BundleName: v("bundle_name"), EndpointName: v("endpoint_name"),
			OriginReservationID: v("origin_reservation_id"), CanonicalPublicOrigin: v("canonical_public_origin")}}
	}
	t.Fatal("the plan has no runtime input")
	return plannedInput{}
}

// guessFromPlan is the offline attack of issue 32 item 3: for each guess, every reference one
// can compute from the plan without a write key (rip1 over the guess; rip2 under keys derivable
// from what the plan shows). It returns the guess that matched the planned reference, or "".
func guessFromPlan(in plannedInput, guesses []string) string {
	nonceKey := sha256.Sum256([]byte(in.nonce))
	parsed, _ := runtimeref.Parse(in.reference)
	for _, g := range guesses {
		bindings := map[string]string{"GREETING": g}
		if runtimeref.Derive(in.nonce, in.target, bindings).Reference == in.reference {
			return g
		}
		for _, k := range [][]byte{nil, make([]byte, 32), nonceKey[:], []byte(in.nonce)} {
			if runtimeref.DeriveV2(k, parsed.SecretID, in.nonce, in.target, bindings).Reference == in.reference {
				return g
			}
		}
	}
	return ""
}

// privateStates is every resource instance's private state in a state file, decoded from the
// base64 the CLI stores it as, one per line.
func privateStates(t *testing.T, state []byte) string {
	t.Helper()
	var f struct {
		Resources []struct {
			Instances []struct {
				Private string `json:"private"`
			} `json:"instances"`
		} `json:"resources"`
	}
	require.NoError(t, json.Unmarshal(state, &f))
	var out strings.Builder
	for _, r := range f.Resources {
		for _, i := range r.Instances {
			if i.Private == "" {
				continue
			}
			raw, err := base64.StdEncoding.DecodeString(i.Private)
			require.NoError(t, err, "private state is base64")
			out.Write(raw)
			out.WriteByte('\n')
		}
	}
	return out.String()
}

// TestAccWorkerModule applies examples/modules/worker as its README calls it (one worker calling
// the other through a service binding), re-plans empty, and destroys in order.
func TestAccWorkerModule(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	config := cliProviderBlock + fmt.Sprintf(`
variable "token" {
  type      = string
  sensitive = true
  default   = "module-secret"
}

module "billing" {
  source = %q

  space   = "prod"
  name    = "billing"
  modules = { "index.js" = "export default { fetch() { return new Response('ok') } };" }
  secrets = { TOKEN = var.token }
}

module "plain" {
  source = %q

  space            = "prod"
  name             = "plain"
  modules          = { "index.js" = "export default { async fetch(req, env) { const r = await env.BILLING.fetch('http://billing/'); return new Response('plain+' + await r.text()) } };" }
  vars             = { LEVEL = "info" }
  service_bindings = { BILLING = module.billing.worker_id }
  limits           = { cpu_ms = 2000 }
}

output "url" {
  value = module.billing.url
}

output "plain_url" {
  value = module.plain.url
}
`, module, module)
	// No organization id anywhere: the provider learns it from the Host's capabilities.
	w := newWorkspace(t, h.URL, h.Key, config)
	out, err := w.run("get", "-no-color") // modules; dev_overrides serve the provider without init
	require.NoError(t, err, out)
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	out, err = w.run("output", "-raw", "url")
	require.NoError(t, err, out)
	require.Regexp(t, `^http://billing-prod-[0-9a-f]{32}\.workers\.localhost:`+h.EdgePort()+`/$`, out)
	// The URL answers through the runtime's edge with the module's worker.
	status, body, _ := h.Runtime.Get(t, strings.TrimSuffix(strings.TrimPrefix(out, "http://"), ":"+h.EdgePort()+"/"), "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "ok", body)
	// The other module's worker calls it through its service binding.
	out, err = w.run("output", "-raw", "plain_url")
	require.NoError(t, err, out)
	status, body, _ = h.Runtime.Get(t, strings.TrimSuffix(strings.TrimPrefix(out, "http://"), ":"+h.EdgePort()+"/"), "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, "plain+ok", body)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.NotContains(t, string(state), "module-secret")
}

// TestAccAReadOnlyKeyPlansWithoutTheCommitmentKey: a plan made with a key that cannot write (a
// CI plan) gets no commitment key (SPEC 3.5). An applied runtime input plans no change, with a
// warning that its values were not compared; a new one plans its reference unknown, saying why.
// Neither fails the plan.
func TestAccAReadOnlyKeyPlansWithoutTheCommitmentKey(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	w := newWorkspace(t, h.URL, h.Key, cliProviderBlock+graph("ro", "hello", "s3cret-value", 1), "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID)
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)

	reader := h.NewKey(t, h.Organization.Name, "resources:read")
	w.env = append(w.env, "TAKOFORM_API_KEY="+reader)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "a read-only plan of an applied input plans no change: %s", out)
	require.Contains(t, out, "Runtime input values not compared")
	require.Contains(t, out, "resources:write")

	fresh := newWorkspace(t, h.URL, reader, cliProviderBlock+graph("ro", "other", "s3cret-value", 1), "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID)
	out, err = fresh.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Contains(t, out, "Runtime input reference unknown until apply")
	require.Contains(t, out, "runtime_input_reference = (known after apply)")
	require.NotContains(t, out, "s3cret-value")
}

// TestAccReplacementNeverStrandsASecret (SPEC 4, issue 32 items 1 and 2), through the shipped
// module, with secrets on both sides of a service binding:
//   - one flag replaces the callee (`-replace=module.billing.terraform_data.replace_worker`): its
//     runtime input with it, and the caller and the caller's runtime input because the callee's
//     id changes; the caller's URL answers again afterwards, and how long it did not is logged;
//   - `destroy -target` of the callee's worker (which takes the caller with it) leaves runtime
//     inputs delivered to workers that are gone: the next apply replaces them and converges, and a
//     full destroy works.
func TestAccReplacementNeverStrandsASecret(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	config := cliProviderBlock + fmt.Sprintf(`
module "billing" {
  source = %[1]q

  space   = "prod"
  name    = "billing"
  modules = { "index.js" = "export default { fetch(req, env) { return new Response('billing' + env.TOKEN.length) } };" }
  secrets = { TOKEN = "billing-secret" }
}

module "gateway" {
  source = %[1]q

  space            = "prod"
  name             = "gateway"
  modules          = { "index.js" = "export default { async fetch(req, env) { const r = await env.BILLING.fetch('http://billing/'); return new Response('gateway' + env.KEY.length + '+' + await r.text()) } };" }
  secrets          = { KEY = "gateway-secret-1" }
  service_bindings = { BILLING = module.billing.worker_id }
}

output "gateway_host" {
  value = trimsuffix(trimprefix(module.gateway.url, "http://"), ":%[2]s/")
}
`, module, h.EdgePort())
	w := newWorkspace(t, h.URL, h.Key, config)
	run := func(args ...string) string {
		t.Helper()
		out, err := w.run(args...)
		require.NoError(t, err, "%v:\n%s", args, out)
		return out
	}
	run("get", "-no-color")
	run("apply", "-auto-approve", "-input=false", "-no-color")
	host := strings.TrimSpace(run("output", "-raw", "gateway_host"))
	const answer = "gateway16+billing14"
	status, body, _ := h.Runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, answer, body)

	// One flag: the callee and everything that must go with it. The caller's URL is watched the
	// whole time.
	stop := make(chan struct{})
	var longest time.Duration
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		var since time.Time
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			code, got, _, err := h.Runtime.TryGet(host, "/")
			switch {
			case err == nil && code == http.StatusOK && got == answer:
				if !since.IsZero() {
					longest = max(longest, time.Since(since))
				}
				since = time.Time{}
			case since.IsZero():
				since = time.Now()
			}
		}
	}()
	out := run("apply", "-auto-approve", "-input=false", "-no-color", "-replace=module.billing.terraform_data.replace_worker")
	close(stop)
	<-watched
	require.Contains(t, out, "module.gateway.takoform_worker_runtime_input.this[0]", "the caller's runtime input is replaced with the caller")
	t.Logf("the caller's URL did not answer for at most %s during the callee's replacement", longest.Round(10*time.Millisecond))
	status, body, _ = h.Runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, answer, body)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)

	// The worker alone fails at plan, naming what to use instead.
	out, err = w.run("plan", "-input=false", "-no-color", "-replace=module.billing.takoform_worker.this")
	require.Error(t, err, out)
	require.Contains(t, out, "Runtime input delivered to another worker")
	require.Contains(t, out, "terraform_data.replace_worker")

	// destroy -target takes the callee's worker, and the caller that binds it, away from their
	// runtime inputs; the next apply seals them again, and a full destroy works.
	run("destroy", "-auto-approve", "-input=false", "-no-color", "-target=module.billing.takoform_worker.this")
	out = run("apply", "-auto-approve", "-input=false", "-no-color")
	require.Contains(t, out, "Runtime input replaced: its worker is gone")
	status, body, _ = h.Runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, answer, body)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
	run("destroy", "-auto-approve", "-input=false", "-no-color")
}

// TestAccAnActivationMadeElsewhereIsAdoptedByReading (issue 32 item 13): an activation created
// through the API under a token this provider never derived is imported by reading its token
// from the Host (GET .../activation), plans no change, and is destroyed with it.
func TestAccAnActivationMadeElsewhereIsAdoptedByReading(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	full := cliProviderBlock + graph("adopt", "hello", "s3cret-value", 1)
	cut := strings.Index(full, `resource "takoform_worker_endpoint_activation" "a"`)
	require.Positive(t, cut)
	w := newWorkspace(t, h.URL, h.Key, full[:cut], "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID)
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)

	c, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key})
	require.NoError(t, err)
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	var st struct {
		Resources []struct {
			Type      string `json:"type"`
			Instances []struct {
				Attributes map[string]any `json:"attributes"`
			} `json:"instances"`
		} `json:"resources"`
	}
	require.NoError(t, json.Unmarshal(state, &st))
	var reservationID, endpointID string
	for _, r := range st.Resources {
		switch r.Type {
		case "takoform_worker_endpoint_origin_reservation":
			reservationID = r.Instances[0].Attributes["id"].(string)
		case "takoform_worker_endpoint":
			endpointID = r.Instances[0].Attributes["id"].(string)
		}
	}
	_, _, err = c.PutActivation(t.Context(), reservationID, "token-made-elsewhere-0001", endpointID)
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(full+`
import {
  to = takoform_worker_endpoint_activation.a
  id = takoform_worker_endpoint_origin_reservation.r.id
}
`), 0o600))
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Contains(t, out, "1 imported")
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
}

// TestAccAPlanNamesTheWorkerABindingReaches (issue 32 item 8): a binding moved to another worker
// shows in the plan as the workers' space/name, not only their UIDs; an unchanged configuration
// plans nothing.
func TestAccAPlanNamesTheWorkerABindingReaches(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := func(callee string) string {
		return cliProviderBlock + fmt.Sprintf(`
resource "takoform_worker" "catalog" {
  for_each           = toset(["catalog-a", "catalog-b"])
  space              = "prod"
  name               = each.key
  main_module        = "index.js"
  modules            = { "index.js" = "export default { fetch() { return new Response('${each.key}') } };" }
  compatibility_date = "2025-01-01"
}

resource "takoform_worker" "shop" {
  space              = "prod"
  name               = "shop"
  main_module        = "index.js"
  modules            = { "index.js" = "export default { fetch(r, env) { return env.CATALOG.fetch(r) } };" }
  compatibility_date = "2025-01-01"
  service_bindings   = { CATALOG = takoform_worker.catalog[%q].id }
}
`, callee)
	}
	w := newWorkspace(t, h.URL, h.Key, config("catalog-a"))
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, "first apply: %s", out)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)

	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(config("catalog-b")), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Contains(t, out, `"CATALOG" = "prod/catalog-a" -> "prod/catalog-b"`, out)
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, "apply of the moved binding: %s", out)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
}
