package edge_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// deadTarget is an incarnation socket nobody listens on any more (its process died).
type deadTarget struct{ addr string }

func (d deadTarget) Addr() string   { return d.addr }
func (d deadTarget) Script() string { return "secret-script-name" }
func (deadTarget) Acquire() bool    { return true }
func (deadTarget) Release()         {}

type stubResolver map[string]edge.Target

func (s stubResolver) Resolve(host string) (edge.Target, int) {
	t, ok := s[host]
	switch {
	case !ok:
		return nil, edge.UnknownHost
	case t == nil:
		return nil, edge.NotReady
	}
	return t, edge.Found
}

// Every error the edge answers on its own is a problem that names no socket, script or Go error
// (SPEC 5.1): a dead socket (502), a route without a Ready incarnation (503), an unknown host
// (404).
func TestEdgeErrorsNameNothingInternal(t *testing.T) {
	t.Parallel()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := gone.Addr().String()
	gone.Close()
	_, port, _ := net.SplitHostPort(dead)

	h := edge.New(stubResolver{"dead.test": deadTarget{dead}, "starting.test": nil}, nil, nil, edge.Limits{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewServer(h, edge.Limits{}, nil)
	go func() { _ = srv.Serve(edge.Listener(l)) }()
	t.Cleanup(func() { _ = srv.Close() })

	for host, want := range map[string]struct {
		status int
		code   string
	}{
		"dead.test":     {http.StatusBadGateway, adminapi.CodeUpstreamError},
		"starting.test": {http.StatusServiceUnavailable, adminapi.CodeNotReady},
		"nobody.test":   {http.StatusNotFound, adminapi.CodeUnknownHost},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+"/", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, want.status, resp.StatusCode, "%s: %s", host, body)
		require.Equal(t, adminapi.ProblemContentType, resp.Header.Get("Content-Type"))
		var p adminapi.Problem
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, want.code, p.Code)
		for _, s := range []string{"127.0.0.1", port, "secret-script-name", "dial", "connect", "refused", "tcp", "EOF"} {
			require.NotContains(t, string(body), s, "%s: the error names something internal", host)
		}
	}
}
