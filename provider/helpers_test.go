package provider_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-version"
	"github.com/hashicorp/terraform-plugin-testing/tfversion"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// fixture is a real Host on a fresh PostgreSQL database, with a client of its organization for
// what a test does behind the provider's back.
type fixture struct {
	h   *testhost.Host
	api *client.Client
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	requireCLI(t)
	h := testhost.Start(t, testhost.Options{})
	api, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key, OrganizationID: h.Organization.ID, MaxRetries: 2})
	require.NoError(t, err)
	return &fixture{h: h, api: api}
}

// providerBlock configures the provider for this fixture's organization.
func (f *fixture) providerBlock() string {
	return providerConfig(f.h.URL, f.h.Key, f.h.Organization.ID)
}

// providerConfig configures the provider for an organization of the Host at endpoint.
func providerConfig(endpoint, key, organization string) string {
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
`, endpoint, key, organization)
}

func (f *fixture) config(body string) string { return f.providerBlock() + body }

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

// identityCLIs gates identity checks to CLIs that support resource identity (>= 1.12).
var identityCLIs = []tfversion.TerraformVersionCheck{tfversion.SkipBelow(version.Must(version.NewVersion("1.12.0")))}

// workerSource is a worker that answers with its secret's length, never the secret.
const workerSource = `export default { async fetch(request, env) { return new Response("hello, " + String((env.GREETING || "").length)); } };`

// graph is the full graph of SPEC 4 for one worker: reservation, runtime input, worker, endpoint
// and activation.
func graph(space, name, secret string, version int) string {
	return strings.NewReplacer("SPACE", space, "NAME", name, "SECRET", secret, "VERSION", fmt.Sprint(version), "SOURCE", workerSource).Replace(`
resource "takoform_worker_endpoint_origin_reservation" "r" {
  space       = "SPACE"
  worker_name = "NAME"
}

resource "takoform_worker_runtime_input" "ri" {
  space                   = "SPACE"
  worker_name             = "NAME"
  endpoint_name           = "NAME"
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.r.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.r.canonical_origin
  bindings_wo             = { GREETING = "SECRET" }
  bindings_wo_version     = VERSION
}

resource "takoform_worker" "w" {
  space                   = "SPACE"
  name                    = "NAME"
  main_module             = "index.js"
  modules                 = { "index.js" = <<-JS
    SOURCE
  JS
  }
  compatibility_date      = "2025-01-01"
  required_sensitive_vars = ["GREETING"]
  runtime_input_reference = takoform_worker_runtime_input.ri.reference
}

resource "takoform_worker_endpoint" "e" {
  space                 = "SPACE"
  name                  = "NAME"
  worker                = takoform_worker.w.name
  worker_id             = takoform_worker.w.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.r.id
}

resource "takoform_worker_endpoint_activation" "a" {
  reservation_id = takoform_worker_endpoint_origin_reservation.r.id
  endpoint_id    = takoform_worker_endpoint.e.id
}
`)
}

// noIdentity skips a step on CLIs without resource identity (< 1.12).
func noIdentity() (bool, error) { return !identitySupported(), nil }

func identitySupported() bool {
	out, err := exec.Command(accCLI.path, "version", "-json").Output()
	if err != nil {
		return false
	}
	var v struct {
		Version string `json:"terraform_version"`
	}
	if json.Unmarshal(out, &v) != nil {
		return false
	}
	got, err := version.NewVersion(v.Version)
	return err == nil && !got.LessThan(version.Must(version.NewVersion("1.12.0")))
}
