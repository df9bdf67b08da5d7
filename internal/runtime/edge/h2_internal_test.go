package edge

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// The HTTP/2 server starts with Serve, not with the first HTTP/2 client: a TLS configuration its
// HTTP/2 setup refuses (cipher suites without one HTTP/2 requires) ends Serve with that error at
// once.
func TestH2ServerStartsWithServeAndItsErrorIsSurfaced(t *testing.T) {
	t.Parallel()
	config := &tls.Config{CipherSuites: []uint16{tls.TLS_RSA_WITH_AES_128_CBC_SHA}, NextProtos: []string{"h2", "http/1.1"}}
	s := NewH1Server(http.NotFoundHandler(), Limits{}, nil)
	s.SetTLSConfig(config)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(TLSListener(l, config, time.Second)) }()
	t.Cleanup(func() { _ = s.Close() })
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "http2") {
			t.Fatalf("Serve returned %v, want the HTTP/2 setup's error", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve went on with an HTTP/2 server that cannot start")
	}
}

// The HTTP/2 server adjusts its own copy of the TLS configuration: the one the TLS listener
// handshakes with is left as it was, while HTTP/2 clients are served.
func TestH2ServerLeavesTheListenersTLSConfigAlone(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "edge", "*.workers.test")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	config := &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2"}}
	s := NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, r.Proto)
	}), Limits{}, nil)
	s.SetTLSConfig(config)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(TLSListener(l, config, time.Second)) }()
	t.Cleanup(func() { _ = s.Close() })

	roots := x509.NewCertPool()
	b, err := os.ReadFile(ca.CertFile)
	if err != nil {
		t.Fatal(err)
	}
	roots.AppendCertsFromPEM(b)
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: "a.workers.test"}, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + l.Addr().String() + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "HTTP/2.0" {
		t.Fatalf("answered %q over %s", body, resp.Proto)
	}
	if !slices.Equal(config.NextProtos, []string{"h2"}) {
		t.Fatalf("the listener's TLS configuration was changed: NextProtos %q", config.NextProtos)
	}
}
