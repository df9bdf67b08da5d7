package provider_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// TestAccWorkerModuleTakesEphemeralSecrets: a root module passes an `ephemeral = true` variable to
// examples/modules/worker (ephemeral_secrets with its names in secret_names), as the README
// advises; the plan file, the state and the CLI's output never hold it, the worker gets it, a
// re-plan is empty, and names that do not match the values fail at plan.
func TestAccWorkerModuleTakesEphemeralSecrets(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	secret := "eph-" + strings.Repeat("9c4e", 5)
	config := func(name, names string) string {
		return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

variable "greeting" {
  type      = string
  sensitive = true
  ephemeral = true
}

module "hello" {
  source = %q

  space             = "eph"
  name              = %q
  modules           = { "index.js" = %q }
  ephemeral_secrets = { GREETING = var.greeting }
  secret_names      = %s
}

output "url" {
  value = module.hello.url
}
`, module, name, workerSource, names)
	}
	w := newWorkspace(t, h.URL, h.Key, config("hello", `["GREETING"]`), "TF_VAR_greeting="+secret)
	var outputs []string
	step := func(args ...string) string {
		t.Helper()
		out, err := w.run(args...)
		require.NoError(t, err, out)
		outputs = append(outputs, out)
		return out
	}
	step("get", "-no-color")
	step("plan", "-input=false", "-no-color", "-out=tfplan")
	planJSON := step("show", "-json", "tfplan")
	step("apply", "-input=false", "-no-color", "tfplan")
	url := strings.TrimSpace(step("output", "-raw", "url"))
	host := strings.TrimSuffix(strings.TrimPrefix(url, "http://"), ":"+h.EdgePort()+"/")
	status, body, _ := h.Runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, fmt.Sprintf("hello, %d", len(secret)), body, "the worker got the ephemeral secret")
	step("plan", "-input=false", "-no-color", "-detailed-exitcode")

	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	for what, text := range map[string]string{"plan": planJSON, "state": string(state), "CLI output": strings.Join(outputs, "\n")} {
		require.NotContains(t, text, secret, "the ephemeral secret is not in the %s", what)
	}

	// Names that are not the keys of the values fail at plan, before anything changes.
	wrong := newWorkspace(t, h.URL, h.Key, config("wrong", `["GREETING", "OTHER"]`), "TF_VAR_greeting="+secret)
	out, err := wrong.run("get", "-no-color")
	require.NoError(t, err, out)
	out, err = wrong.run("plan", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "secret_names must name exactly the keys of ephemeral_secrets")
	require.NotContains(t, out, secret)

	step("destroy", "-auto-approve", "-input=false", "-no-color")
}
