package provider_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

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
