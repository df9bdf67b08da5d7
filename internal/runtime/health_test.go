package runtime_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// healthz asks the edge's health check with the Host header host (0 when nothing answered).
func healthz(f *fixture, host string) (int, string) {
	code, body, _, _ := f.h.TryGet(host, "/healthz")
	return code, body
}

// The edge answers a load balancer's GET /healthz (SPEC 6.2): 200 while the node serves, 503 from
// the moment it drains, while its workers are still served, until it stops; a worker's own
// /healthz at its hostname is never shadowed.
func TestTheEdgeHealthCheckFailsWhileTheNodeDrainsAndNeverShadowsAWorker(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.putSource("echo", "uid-echo", echoSource)
	f.route("echo.workers.localhost", "echo", "ep-echo")
	f.waitReady("echo")
	edge := f.h.Info.EdgeAddr
	for _, host := range []string{"127.0.0.1", edge, "localhost:8787", "[::1]"} {
		code, body := healthz(f, host)
		require.Equal(t, http.StatusOK, code, "%s: %s", host, body)
		require.JSONEq(t, `{"status":"serving"}`, body)
	}
	code, body := healthz(f, "echo.workers.localhost")
	require.Equal(t, http.StatusOK, code)
	var echoed map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &echoed), "the worker answered its own /healthz: %s", body)
	require.Equal(t, "/healthz", echoed["path"])

	drained := make(chan struct{})
	go func() { f.h.Node.Drain(3 * time.Second); close(drained) }()
	require.Eventually(t, func() bool {
		code, _ := healthz(f, "127.0.0.1")
		return code == http.StatusServiceUnavailable
	}, 2*time.Second, 20*time.Millisecond, "the health check fails as the drain begins")
	code, body = healthz(f, "127.0.0.1")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "draining")
	code, _ = healthz(f, "echo.workers.localhost")
	require.Equal(t, http.StatusOK, code, "the workers are still served while it drains")
	<-drained
	require.NoError(t, f.h.Node.Close())
	code, _ = healthz(f, "127.0.0.1")
	require.Zero(t, code, "stopped: nothing answers")
}
