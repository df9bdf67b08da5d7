package provider_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
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
	require.Contains(t, planJSON, "rip1.prep-", "the plan carries the reference")
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
	}
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
	config := fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

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
