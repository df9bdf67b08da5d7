package runtime_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// healthz asks the edge's health check with the Host header host.
func healthz(t *testing.T, edgeAddr, host string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/healthz", nil)
	require.NoError(t, err)
	req.Host = host
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
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
		code, body := healthz(t, edge, host)
		require.Equal(t, http.StatusOK, code, "%s: %s", host, body)
		require.JSONEq(t, `{"status":"serving"}`, body)
	}
	code, body := healthz(t, edge, "echo.workers.localhost")
	require.Equal(t, http.StatusOK, code)
	var echoed map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &echoed), "the worker answered its own /healthz: %s", body)
	require.Equal(t, "/healthz", echoed["path"])

	drained := make(chan struct{})
	go func() { f.h.Node.Drain(3 * time.Second); close(drained) }()
	require.Eventually(t, func() bool {
		code, _ := healthz(t, edge, "127.0.0.1")
		return code == http.StatusServiceUnavailable
	}, 2*time.Second, 20*time.Millisecond, "the health check fails as the drain begins")
	code, body = healthz(t, edge, "127.0.0.1")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "draining")
	code, _ = healthz(t, edge, "echo.workers.localhost")
	require.Equal(t, http.StatusOK, code, "the workers are still served while it drains")
	<-drained
	require.NoError(t, f.h.Node.Close())
	code, _ = healthz(t, edge, "127.0.0.1")
	require.Zero(t, code, "stopped: nothing answers")
}
