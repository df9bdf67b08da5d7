package provider_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/server"
)

// providerDir holds the provider binary built for these tests; the CLIs find it through
// dev_overrides, exactly as a provider developer runs one.
var providerDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "takoform-provider-")
	if err != nil {
		panic(err)
	}
	providerDir = dir
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "terraform-provider-takoform"), "..")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build provider:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testdb.Main(m)
}

// cli is one Terraform-compatible binary to test against.
type cli struct {
	name string
	path string
}

// clis returns the pinned OpenTofu (required under CI=true) and terraform when it is on PATH.
func clis(t *testing.T) []cli {
	t.Helper()
	var out []cli
	tofu := os.Getenv("TAKOFORM_TOFU")
	if tofu == "" {
		if p, err := filepath.Abs("../.tools/bin/tofu"); err == nil {
			if _, err := os.Stat(p); err == nil {
				tofu = p
			}
		}
	}
	if tofu == "" {
		if p, err := exec.LookPath("tofu"); err == nil {
			tofu = p
		}
	}
	if tofu != "" {
		out = append(out, cli{"tofu", tofu})
	} else if os.Getenv("CI") != "" {
		t.Fatal("no OpenTofu: run tools/opentofu.sh (CI=true never skips acceptance tests)")
	}
	if p, err := exec.LookPath("terraform"); err == nil {
		out = append(out, cli{"terraform", p})
	}
	if len(out) == 0 {
		t.Skip("neither tofu nor terraform is available; run tools/opentofu.sh")
	}
	return out
}

// workspace is a directory with a configuration, a CLI config with dev_overrides, and the
// environment to run a CLI in it.
type workspace struct {
	t   *testing.T
	cli cli
	dir string
	env []string
}

func newWorkspace(t *testing.T, c cli, endpoint, apiKey, config string) *workspace {
	t.Helper()
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

// host starts a real Host on a fresh database and returns its URL and a key of a new organization.
func host(t *testing.T) (string, string) {
	t.Helper()
	db := testdb.Pool(t)
	srv := server.New(server.Config{DB: db, Logger: slog.New(slog.NewJSONHandler(&bytes.Buffer{}, nil))})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	ctx := context.Background()
	_, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	key, err := auth.CreateKey(ctx, db, "acme", nil)
	require.NoError(t, err)
	return ts.URL, key.Key
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
	for _, c := range clis(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			endpoint, key := host(t)
			w := newWorkspace(t, c, endpoint, key, offeringsConfig)
			out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
			require.NoError(t, err, out)
			raw, err := w.run("output", "-json", "offering_ids")
			require.NoError(t, err, raw)
			var ids []string
			require.NoError(t, json.Unmarshal([]byte(raw), &ids), raw)
			require.Equal(t, []string{"selfhost-module-worker", "selfhost-worker-endpoint"}, ids)

			state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
			require.NoError(t, err)
			require.NotContains(t, string(state), key, "the API key never reaches state")
			require.NotContains(t, out, key, "nor the CLI output")
		})
	}
}

func TestAccBadKeyIsAClearError(t *testing.T) {
	t.Parallel()
	for _, c := range clis(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			endpoint, _ := host(t)
			bogus := "tkf_" + strings.Repeat("a", 52)
			w := newWorkspace(t, c, endpoint, bogus, offeringsConfig)
			out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
			require.Error(t, err)
			require.Contains(t, out, "Unable to read offerings")
			require.Contains(t, out, "unauthenticated")
			require.NotContains(t, out, bogus)
		})
	}
}

func TestAccMissingEndpointIsAClearError(t *testing.T) {
	t.Parallel()
	for _, c := range clis(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := newWorkspace(t, c, "", "tkf_x", offeringsConfig)
			out, err := w.run("plan", "-input=false", "-no-color")
			require.Error(t, err)
			require.Contains(t, out, "Unable to configure the Takoform provider")
			require.Contains(t, out, "TAKOFORM_ENDPOINT")
		})
	}
}
