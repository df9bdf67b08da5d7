package provider_test

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

const workersDevGraph = `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

resource "takoform_worker_endpoint_origin_reservation" "r" {
  space       = "prod"
  worker_name = "api"
  offering_id = "cf-worker"
}

resource "takoform_worker" "w" {
  space              = "prod"
  name               = "api"
  offering_id        = "cf-worker"
  main_module        = "index.js"
  modules            = { "index.js" = "export default { fetch() { return new Response(\"on-workers-dev\") } }" }
  compatibility_date = "2025-01-01"
}

resource "takoform_worker_endpoint" "e" {
  space                 = "prod"
  name                  = "api"
  offering_id           = "cf-endpoint"
  worker                = takoform_worker.w.name
  worker_id             = takoform_worker.w.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.r.id
}

resource "takoform_worker_endpoint_activation" "a" {
  reservation_id = takoform_worker_endpoint_origin_reservation.r.id
  endpoint_id    = takoform_worker_endpoint.e.id
}

output "url" {
  value = takoform_worker_endpoint.e.url
}
`

// A worker, its endpoint, reservation and activation applied on a workers-dev offering run on
// the Cloudflare stand-in, answer at their workers.dev URL, and destroy leaves the URL answering
// 404 and nothing on the account; destroy waits out the route's propagation window (the release
// is fenced until then).
func TestAccWorkersDevEndpointAppliesAnswersAndDestroysToNothing(t *testing.T) {
	t.Parallel()
	const token, account = "cf-acc-token-canary-0b5e55ed", "0123456789abcdef0123456789abcdef"
	s, err := cfstandin.New(cfstandin.Config{Token: token, AccountID: account, AccountSubdomain: "acme", Workerd: workerdtest.Binary(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	dir := filepath.Join(t.TempDir(), "conf")
	require.NoError(t, safedir.Ensure(dir, safedir.Current()))
	require.NoError(t, safedir.WriteFile(dir, "cf-token", []byte(token), safedir.Current()))
	body, err := json.Marshal(map[string]any{
		"installations": []any{map[string]any{"name": "cf", "pack": "workers-dev", "accountSubdomain": "acme", "accountId": account,
			"apiTokenFile": filepath.Join(dir, "cf-token"), "apiBaseUrl": s.BaseURL(), "routePropagationSeconds": 2}},
		"offerings": []any{
			map[string]any{"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": []string{"*"}},
			map[string]any{"id": "cf-endpoint", "kind": "worker-endpoint", "installation": "cf", "soldTo": []string{"*"}},
		},
	})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "catalog.json"), body, 0o600))
	cat, err := catalog.Load(filepath.Join(dir, "catalog.json"))
	require.NoError(t, err)
	h := testhost.Start(t, testhost.Options{Catalog: cat})

	w := newWorkspace(t, h.URL, h.Key, workersDevGraph)
	w.apply(workersDevGraph)
	raw, err := w.run("output", "-raw", "url")
	require.NoError(t, err, raw)
	url := strings.TrimSpace(raw)
	require.True(t, strings.HasSuffix(url, ".acme.workers.dev/"), url)
	get := func() (int, string) {
		res, err := s.EdgeClient().Get(url)
		require.NoError(t, err)
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	status, answer := get()
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "on-workers-dev", answer)

	out, err := w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	status, _ = get()
	require.Equal(t, http.StatusNotFound, status)
	require.Empty(t, s.ScriptNames(""), "nothing is left on the account")
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.NotContains(t, string(state), token)
	require.NotContains(t, out, token)
	require.NotContains(t, h.Logs(), token)
}
