package edge_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// countingUpstream is a worker's socket that counts the requests it gets.
func countingUpstream(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { n.Add(1) }))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String(), &n
}

// requireConnectRefused checks a refusal of CONNECT: 405, a problem naming the method.
func requireConnectRefused(t *testing.T, resp *http.Response) {
	t.Helper()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s", body)
	require.Equal(t, adminapi.ProblemContentType, resp.Header.Get("Content-Type"))
	require.NotEmpty(t, resp.Header.Get("Allow"))
	var p adminapi.Problem
	require.NoError(t, json.Unmarshal(body, &p))
	require.Equal(t, adminapi.CodeMethodNotAllowed, p.Code)
}

// CONNECT over HTTP/1.x is refused at the edge with a problem, never reaches a worker, and its
// connection is closed: what the client sends after it (a tunnel's bytes) is never read as a
// request.
func TestConnectIsRefusedOverHTTP1(t *testing.T) {
	t.Parallel()
	up, hits := countingUpstream(t)
	h := edge.New(stubResolver{"w.test": liveTarget{up}}, nil, nil, edge.Limits{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(h, edge.Limits{}, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err = io.WriteString(c, "CONNECT w.test:443 HTTP/1.1\r\nHost: w.test:443\r\n\r\nGET / HTTP/1.1\r\nHost: w.test\r\n\r\n")
	require.NoError(t, err)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	require.NoError(t, err)
	requireConnectRefused(t, resp)
	require.True(t, resp.Close, "the connection is kept after a CONNECT")
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the connection was not closed")
	require.Zero(t, hits.Load(), "a request reached the worker")
}

// CONNECT over HTTP/2 is refused at the edge with a problem and never reaches a worker.
func TestConnectIsRefusedOverHTTP2(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "edge", "*.workers.test")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	config := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	up, hits := countingUpstream(t)
	h := edge.New(stubResolver{"a.workers.test": liveTarget{up}}, nil, nil, edge.Limits{})
	srv := edge.NewH1Server(h, edge.Limits{}, nil)
	srv.SetTLSConfig(config)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(edge.TLSListener(l, config, 10*time.Second)) }()
	t.Cleanup(func() { _ = srv.Close() })

	roots := x509.NewCertPool()
	b, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(b))
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "a.workers.test"}, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequest(http.MethodConnect, "https://"+l.Addr().String(), pr)
	require.NoError(t, err)
	req.Host = "a.workers.test:443"
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, 2, resp.ProtoMajor)
	requireConnectRefused(t, resp)
	require.Zero(t, hits.Load(), "a request reached the worker")
}

// The plain-HTTP listener beside an HTTPS edge refuses CONNECT too, rather than redirect it.
func TestTheRedirectRefusesConnect(t *testing.T) {
	t.Parallel()
	h := edge.New(routes{"app.workers.test": true}, nil, nil, edge.Limits{})
	w := httptest.NewRecorder()
	edge.Redirect(h, 0).ServeHTTP(w, httptest.NewRequest(http.MethodConnect, "app.workers.test:443", nil))
	requireConnectRefused(t, w.Result())
}
