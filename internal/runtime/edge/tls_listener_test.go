package edge_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// TLSListener completes handshakes off the accept path: a client that opens a connection and
// never says hello holds up no other client, and is dropped at the handshake limit. HTTP/2 and
// HTTP/1.1 are both served, each request knows it came over TLS, and a plain HTTP request on the
// TLS port is told so.
func TestTLSListenerNeverWaitsOnAStalledHandshake(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "edge", "*.workers.test")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	config := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	const limit = 2 * time.Second
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s tls=%v", r.Proto, r.TLS != nil)
	}), edge.Limits{HeaderTimeout: limit}, nil)
	srv.SetTLSConfig(config)
	accepted := make(chan struct{}, 8)
	go func() { _ = srv.Serve(edge.TLSListener(acceptSignalling{l, accepted}, config, limit)) }()
	t.Cleanup(func() { _ = srv.Close() })
	addr := l.Addr().String()

	stalled, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer stalled.Close()
	select {
	case <-accepted: // its handshake waiting
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled connection was never accepted")
	}

	roots := x509.NewCertPool()
	b, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(b))
	for _, h2 := range []bool{true, false} {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "a.workers.test"}, ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		began := time.Now()
		req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/", nil)
		require.NoError(t, err)
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
		require.NoError(t, err)
		require.Less(t, time.Since(began), limit/2, "a client waited on another's handshake")
		want := "HTTP/1.1 tls=true"
		if h2 {
			want = "HTTP/2.0 tls=true"
		}
		require.Equal(t, want, string(body))
	}

	// The stalled connection is closed at the limit.
	require.NoError(t, stalled.SetReadDeadline(time.Now().Add(3*limit)))
	began := time.Now()
	_, err = stalled.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.Less(t, time.Since(began), limit+time.Second)

	plain, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer plain.Close()
	_, err = io.WriteString(plain, "GET / HTTP/1.1\r\nHost: a.workers.test\r\n\r\n")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(plain), nil)
	require.NoError(t, err)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
}

// acceptSignalling is a listener that signals each connection it accepts.
type acceptSignalling struct {
	net.Listener
	accepted chan<- struct{}
}

func (l acceptSignalling) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		select {
		case l.accepted <- struct{}{}:
		default:
		}
	}
	return c, err
}
