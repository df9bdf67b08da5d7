package edge_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// routes is a Resolver that knows hostnames and nothing else (Redirect only asks whether one is
// routed).
type routes map[string]bool

func (r routes) Resolve(host string) (edge.Target, int) {
	if r[host] {
		return nil, edge.NotReady
	}
	return nil, edge.UnknownHost
}

// The redirect beside an HTTPS edge names the port clients reach it on (configured, behind a port
// mapping), or none at all for the scheme's default; never the port the edge listens on, which
// it does not know.
func TestRedirectNamesThePublicHTTPSPort(t *testing.T) {
	t.Parallel()
	h := edge.New(routes{"app.workers.test": true}, nil, nil, edge.Limits{})
	for port, want := range map[int]string{
		0:    "https://app.workers.test/a/b?c=d",
		443:  "https://app.workers.test/a/b?c=d",
		8443: "https://app.workers.test:8443/a/b?c=d",
	} {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "http://App.Workers.Test.:8080/a/b?c=d", nil)
		edge.Redirect(h, port).ServeHTTP(w, r)
		require.Equal(t, http.StatusPermanentRedirect, w.Code, "port %d", port)
		require.Equal(t, want, w.Header().Get("Location"), "port %d", port)
	}
	w := httptest.NewRecorder()
	edge.Redirect(h, 8443).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://evil.example/", nil))
	require.Equal(t, http.StatusNotFound, w.Code)
	require.Empty(t, w.Header().Get("Location"))
}

// The plain-HTTP listener answers the health check for an address (a load balancer checking the
// port whose IP has no certificate) and redirects a hostname's /healthz like any other path.
func TestTheRedirectListenerAnswersTheHealthCheckForAnAddress(t *testing.T) {
	t.Parallel()
	h := edge.New(routes{"app.workers.test": true}, nil, nil, edge.Limits{})
	draining := false
	h.SetHealth(func() (bool, string) { return !draining, "draining" })
	w := httptest.NewRecorder()
	edge.Redirect(h, 0).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://10.0.0.7/healthz", nil))
	require.Equal(t, http.StatusOK, w.Code)
	draining = true
	w = httptest.NewRecorder()
	edge.Redirect(h, 0).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://10.0.0.7:80/healthz", nil))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	w = httptest.NewRecorder()
	edge.Redirect(h, 0).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://app.workers.test/healthz", nil))
	require.Equal(t, http.StatusPermanentRedirect, w.Code, "a worker's own /healthz")
}
