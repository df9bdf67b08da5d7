package edge_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// keptConn is a client's keep-alive HTTP/1.1 connection to the edge, from a local address of its
// choosing (127.0.0.1, 127.0.0.2, …: each is a source of its own).
type keptConn struct {
	net.Conn
	br *bufio.Reader
}

func dialFrom(t *testing.T, local, addr string) *keptConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return &keptConn{Conn: c, br: bufio.NewReader(c)}
}

// get sends one request for host and returns its status (0 if the connection gave no answer);
// the connection is kept.
func (c *keptConn) get(host string) int {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\n\r\n"); err != nil {
		return 0
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// requireClosedUnread checks that the edge closed c without answering: it reads nothing but the
// end of the connection (or a reset).
func requireClosedUnread(t *testing.T, c *keptConn, why string) {
	t.Helper()
	require.Zero(t, c.get("w.test"), why)
}

// okUpstream is a worker's socket that answers every request 200.
func okUpstream(t *testing.T) string {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") }))
	t.Cleanup(up.Close)
	return up.Listener.Addr().String()
}

// serveEdge serves a Handler routing w.test to a live worker, with limits, on a plain listener.
func serveEdge(t *testing.T, limits edge.Limits) (*edge.Server, string) {
	t.Helper()
	h := edge.New(stubResolver{"w.test": liveTarget{okUpstream(t)}}, nil, nil, limits)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(h, limits, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return srv, l.Addr().String()
}

// One source's idle keep-alive connections are held to MaxConnsPerSource: the next is closed
// unread, while another source is served and the source's own connections go on being served.
// Closed connections are released: the source may open as many again.
func TestASourceIsHeldToItsConnectionCap(t *testing.T) {
	t.Parallel()
	const perSource = 4
	srv, addr := serveEdge(t, edge.Limits{MaxConnsPerSource: perSource, MaxConns: 100})

	var held []*keptConn
	for range perSource {
		c := dialFrom(t, "127.0.0.1", addr)
		require.Equal(t, http.StatusOK, c.get("w.test"))
		held = append(held, c) // idle, kept alive
	}
	require.Equal(t, perSource, srv.Conns())

	requireClosedUnread(t, dialFrom(t, "127.0.0.1", addr), "a connection beyond the source's cap was served")
	require.Equal(t, uint64(1), srv.Refused())
	require.Equal(t, http.StatusOK, dialFrom(t, "127.0.0.2", addr).get("w.test"), "another source was refused")
	for _, c := range held {
		require.Equal(t, http.StatusOK, c.get("w.test"), "a connection within the cap stopped being served")
	}

	for _, c := range held {
		c.Close()
	}
	require.Eventually(t, func() bool { return srv.Conns() == 1 }, 10*time.Second, 5*time.Millisecond,
		"closed connections are still counted: %d", srv.Conns())
	for range perSource {
		require.Equal(t, http.StatusOK, dialFrom(t, "127.0.0.1", addr).get("w.test"), "a released connection's place was not given back")
	}
	requireClosedUnread(t, dialFrom(t, "127.0.0.1", addr), "the cap no longer holds after connections were released")
}

// All sources together are held to MaxConns: a new source is refused while the edge holds that
// many, and served once one of them closes.
func TestTheEdgeIsHeldToItsTotalConnectionCap(t *testing.T) {
	t.Parallel()
	srv, addr := serveEdge(t, edge.Limits{MaxConnsPerSource: 100, MaxConns: 3})

	first := dialFrom(t, "127.0.0.1", addr)
	for _, c := range []*keptConn{first, dialFrom(t, "127.0.0.1", addr), dialFrom(t, "127.0.0.2", addr)} {
		require.Equal(t, http.StatusOK, c.get("w.test"))
	}
	requireClosedUnread(t, dialFrom(t, "127.0.0.3", addr), "a connection beyond the total cap was served")
	require.Equal(t, uint64(1), srv.Refused())

	first.Close()
	require.Eventually(t, func() bool { return srv.Conns() == 2 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, http.StatusOK, dialFrom(t, "127.0.0.3", addr).get("w.test"))
}

// A trusted proxy carries many clients on its connections: it is held to the total cap only.
func TestATrustedProxyIsHeldToTheTotalCapOnly(t *testing.T) {
	t.Parallel()
	trusted, err := edge.ParseTrustedProxies([]string{"127.0.0.1"})
	require.NoError(t, err)
	srv, addr := serveEdge(t, edge.Limits{MaxConnsPerSource: 1, MaxConns: 100, TrustedProxies: trusted})
	for range 3 {
		require.Equal(t, http.StatusOK, dialFrom(t, "127.0.0.1", addr).get("w.test"))
	}
	require.Equal(t, http.StatusOK, dialFrom(t, "127.0.0.2", addr).get("w.test"))
	requireClosedUnread(t, dialFrom(t, "127.0.0.2", addr), "an untrusted source went past its cap")
	require.Equal(t, uint64(1), srv.Refused())
}

// Over TLS a connection counts from its accept, before its handshake, and connections that go to
// the HTTP/2 server count like the others; the plain-HTTP redirect listener, limited by the
// server (LimitListener), shares the caps.
func TestEveryListenerCountsItsConnectionsFromTheirAccept(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "edge", "*.workers.test")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	config := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	limits := edge.Limits{MaxConnsPerSource: 2, MaxConns: 100}
	h := edge.New(stubResolver{"a.workers.test": liveTarget{okUpstream(t)}}, nil, nil, limits)
	srv := edge.NewH1Server(h, limits, nil)
	srv.SetTLSConfig(config)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(edge.TLSListener(l, config, 10*time.Second)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := l.Addr().String()
	redirectL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	redirect := &http.Server{Handler: edge.Redirect(h, 0), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = redirect.Serve(srv.LimitListener(redirectL)) }()
	t.Cleanup(func() { _ = redirect.Close() })

	roots := x509.NewCertPool()
	b, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(b))
	clientTLS := func() *tls.Config { return &tls.Config{RootCAs: roots, ServerName: "a.workers.test"} }
	from := func(local string) *net.Dialer {
		return &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 5 * time.Second}
	}

	// An HTTP/2 client, served and kept alive, and a connection that never says hello.
	tr := &http.Transport{TLSClientConfig: clientTLS(), ForceAttemptHTTP2: true, DialContext: from("127.0.0.1").DialContext}
	t.Cleanup(tr.CloseIdleConnections)
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/", nil)
	require.NoError(t, err)
	req.Host = "a.workers.test"
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, 2, resp.ProtoMajor)
	silent := dialFrom(t, "127.0.0.1", addr)
	require.Eventually(t, func() bool { return srv.Conns() == 2 }, 10*time.Second, 5*time.Millisecond,
		"a connection in its handshake is not counted")

	_, err = tls.DialWithDialer(from("127.0.0.1"), "tcp", addr, clientTLS())
	require.Error(t, err, "a TLS connection beyond the source's cap was handshaken")
	require.Equal(t, uint64(1), srv.Refused())
	requireClosedUnread(t, dialFrom(t, "127.0.0.1", redirectL.Addr().String()), "the redirect listener does not share the caps")
	require.Equal(t, uint64(2), srv.Refused())

	other, err := tls.DialWithDialer(from("127.0.0.2"), "tcp", addr, clientTLS())
	require.NoError(t, err, "another source was refused")
	other.Close()
	redirected := dialFrom(t, "127.0.0.2", redirectL.Addr().String())
	require.Equal(t, http.StatusNotFound, redirected.get("elsewhere.test"))
	redirected.Close()

	// Released when closed, whoever closes them: the HTTP/2 server, the handshake's end.
	tr.CloseIdleConnections()
	silent.Close()
	require.Eventually(t, func() bool { return srv.Conns() == 0 }, 10*time.Second, 5*time.Millisecond,
		"closed connections are still counted: %d", srv.Conns())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	again, err := (&tls.Dialer{NetDialer: from("127.0.0.1"), Config: clientTLS()}).DialContext(ctx, "tcp", addr)
	require.NoError(t, err)
	again.Close()
}
