package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestAnEndpointNamingNoOfferingGoesWhereItsWorkerRuns: with endpoint offerings on two
// installations sold, an endpoint that names none takes the one on its worker's installation
// (the only eligible one), instead of answering offering_ambiguous; with no such worker, the
// choice stays ambiguous.
func TestAnEndpointNamingNoOfferingGoesWhereItsWorkerRuns(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{
  "installations": [{"name": "local", "pack": "selfhost"}, {"name": "cf", "pack": "workers-dev", "accountSubdomain": "acme"}],
  "offerings": [
    {"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
    {"id": "local-endpoint", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]},
    {"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": ["*"]},
    {"id": "cf-endpoint", "kind": "worker-endpoint", "installation": "cf", "soldTo": ["*"]}
  ]
}`
	})
	body := workerBody()
	body["offeringId"] = "local-worker"
	r := h.putWorker("prod", "api", tokenA, body)
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	r = h.putEndpoint("prod", "api", tokenB, map[string]any{"worker": "api"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Equal(t, "local-endpoint", r.json(t)["offeringId"])

	h.putEndpoint("prod", "other", "token-cccccccccccccccc", map[string]any{"worker": "nobody"}).problem(t, http.StatusUnprocessableEntity, "offering_ambiguous")
}
