package edge_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// echoUpstream is a worker's socket that answers with the request headers it got, as JSON.
func echoUpstream(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(r.Header)
	}))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String()
}

// clientHeaders are what the worker must never see of a client's own claims to an address, by
// their names and spelt with underscores (which CGI-style servers take for the same header).
var clientHeaders = map[string]string{
	"CF-Connecting-IP": "6.6.6.6", "True-Client-IP": "6.6.6.6", "X-Real-IP": "6.6.6.6",
	"CF_Connecting_IP": "6.6.6.6", "True_Client_IP": "6.6.6.6", "X_Forwarded_For": "6.6.6.6",
}

// seen sends a request for w.test through the edge at addr with headers, and returns the headers
// the worker got.
func seen(t *testing.T, addr string, headers map[string]string) http.Header {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
	require.NoError(t, err)
	req.Host = "w.test"
	for k, v := range headers {
		req.Header[k] = []string{v} // as spelt
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	var got http.Header
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	return got
}

// A client's CF-Connecting-IP and True-Client-IP never reach a worker: the edge writes them
// with the client address it determined, as X-Real-Ip, trusted proxies' word included.
func TestCFConnectingIPAndTrueClientIPAreTheEdgesOwn(t *testing.T) {
	t.Parallel()
	up := echoUpstream(t)
	serve := func(limits edge.Limits) string {
		h := edge.New(stubResolver{"w.test": liveTarget{up}}, nil, nil, limits)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		srv := edge.NewH1Server(h, limits, nil)
		go func() { _ = srv.Serve(l) }()
		t.Cleanup(func() { _ = srv.Close() })
		return l.Addr().String()
	}

	got := seen(t, serve(edge.Limits{}), clientHeaders)
	for _, k := range []string{"Cf-Connecting-Ip", "True-Client-Ip", "X-Real-Ip", "X-Forwarded-For"} {
		require.Equal(t, []string{"127.0.0.1"}, got[k], "%s: %v", k, got)
	}
	for k, vv := range got {
		for _, v := range vv {
			require.NotContains(t, v, "6.6.6.6", "a client's claim reached the worker in %s", k)
		}
	}

	trusted, err := edge.ParseTrustedProxies([]string{"127.0.0.1"})
	require.NoError(t, err)
	got = seen(t, serve(edge.Limits{TrustedProxies: trusted}), map[string]string{
		"X-Forwarded-For": "203.0.113.7", "CF-Connecting-IP": "6.6.6.6", "True-Client-IP": "6.6.6.6",
	})
	for _, k := range []string{"Cf-Connecting-Ip", "True-Client-Ip", "X-Real-Ip"} {
		require.Equal(t, []string{"203.0.113.7"}, got[k], "%s behind a trusted proxy: %v", k, got)
	}
}

// A worker's subrequest for a hostname of this node comes back into the edge in-process: the
// worker it reaches sees no loopback (nor any) address for it, so a worker that trusts 127.0.0.1
// as local never trusts another tenant's worker. Whatever the subrequest's RemoteAddr: the
// loopback, none, or a Unix socket's.
func TestAWorkersSubrequestIsFromNoLocalAddress(t *testing.T) {
	t.Parallel()
	trusted, err := edge.ParseTrustedProxies([]string{"127.0.0.1"})
	require.NoError(t, err)
	target := liveTarget{echoUpstream(t)}
	h := edge.New(stubResolver{"w.test": target}, nil, nil, edge.Limits{TrustedProxies: trusted})
	serves := map[string]func(w http.ResponseWriter, r *http.Request){
		"egress": h.ServeEgress,
		"binding": func(w http.ResponseWriter, r *http.Request) {
			h.ServeBinding(w, r, "caller", func() (edge.Target, int) { return target, edge.Found }, nil)
		},
	}
	for name, serve := range serves {
		for _, remote := range []string{"127.0.0.1:40000", "[::1]:40000", "", "@"} {
			req := httptest.NewRequestWithContext(context.Background(), http.MethodGet, "http://w.test/", nil)
			req.RemoteAddr = remote
			req.Header.Set("X-Forwarded-For", "127.0.0.1")
			req.Header.Set("X-Real-Ip", "127.0.0.1")
			req.Header.Set("CF-Connecting-IP", "127.0.0.1")
			w := httptest.NewRecorder()
			serve(w, req)
			require.Equal(t, http.StatusOK, w.Code, "%s from %q: %s", name, remote, w.Body)
			var got http.Header
			require.NoError(t, json.NewDecoder(w.Body).Decode(&got))
			for _, k := range []string{"X-Forwarded-For", "X-Real-Ip", "Cf-Connecting-Ip", "True-Client-Ip"} {
				require.Equal(t, []string{"unknown"}, got[k], "%s from %q: %s", name, remote, k)
			}
			require.Equal(t, []string{"for=unknown;proto=http"}, got["Forwarded"], "%s from %q", name, remote)
		}
	}
}
