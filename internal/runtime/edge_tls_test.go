package runtime_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// httpsClient reaches the edge at edgeAddr for any hostname (a custom dialer stands in for DNS),
// trusting only the roots in caFile. h2 offers HTTP/2 in ALPN; without it the client speaks
// HTTP/1.1 only.
func httpsClient(t *testing.T, edgeAddr string, roots *x509.CertPool, h2 bool) *http.Client {
	t.Helper()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, edgeAddr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 30 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func poolOf(t *testing.T, pemFiles ...string) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	for _, f := range pemFiles {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		require.True(t, pool.AppendCertsFromPEM(b))
	}
	return pool
}

func getTLS(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// peerCert is the certificate the edge presents for serverName (no verification).
func peerCert(t *testing.T, edgeAddr, serverName string) (*x509.Certificate, error) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", edgeAddr, &tls.Config{ServerName: serverName, InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// A wildcard certificate for the endpoint suffix serves every routed hostname over HTTPS, with
// HTTP/2 when the client offers it and HTTP/1.1 when it does not; the plain-HTTP listener beside
// it redirects only routed hostnames, and nothing answers plain HTTP on the TLS port.
func TestEdgeServesHTTPSWithAWildcardCertificate(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "wildcard", "*.workers.test")
	httpL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f := setup(t, func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile, c.EdgeTLS.HTTPListener = pair.CertFile, pair.KeyFile, httpL
		// Clients reach the HTTPS edge on another port than it listens on (a port mapping).
		c.EdgeTLS.PublicHTTPSPort = 8443
	})
	require.Equal(t, "https", f.h.Info.EdgeScheme)
	require.Equal(t, httpL.Addr().String(), f.h.Info.EdgeHTTPAddr)
	f.script("tls-1", "uid-tls-1", 1, "v1")
	f.route("app.workers.test", "tls-1", "ep-tls-1")
	f.waitReady("tls-1")
	_, port, _ := net.SplitHostPort(f.h.Info.EdgeAddr)
	url := "https://app.workers.test:" + port + "/"

	roots := poolOf(t, ca.CertFile)
	resp, body := getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, roots, true), url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, expectReply("v1", ""), body)
	require.Equal(t, 2, resp.ProtoMajor, "HTTP/2 over TLS")

	resp, body = getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, roots, false), url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, expectReply("v1", ""), body)
	require.Equal(t, 1, resp.ProtoMajor)

	// TLS 1.2 at least.
	old := &tls.Config{RootCAs: roots, ServerName: "app.workers.test", MaxVersion: tls.VersionTLS11}
	_, err = tls.Dial("tcp", f.h.Info.EdgeAddr, old)
	require.Error(t, err)

	// Another CA's client does not trust the edge: the certificate is the one configured.
	_, err = httpsClient(t, f.h.Info.EdgeAddr, poolOf(t, testpki.NewCA(t, "other").CertFile), true).Get(url)
	require.Error(t, err)

	// Plain HTTP on the TLS port is not served.
	req, err := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
	require.NoError(t, err)
	req.Host = "app.workers.test"
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, "Go's TLS server answers a plain request 400 and nothing else")
	}

	// The plain-HTTP listener redirects a routed hostname to https:// on the public port, path and
	// query kept...
	plain := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err = http.NewRequest(http.MethodPost, "http://"+httpL.Addr().String()+"/a/b?c=d", strings.NewReader("x"))
	require.NoError(t, err)
	req.Host = "App.Workers.Test."
	resp, err = plain.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusPermanentRedirect, resp.StatusCode)
	require.Equal(t, "https://app.workers.test:8443/a/b?c=d", resp.Header.Get("Location"))
	// ...and answers any other host 404, with no redirect to a name this node does not serve.
	req.Host = "evil.example"
	resp, err = plain.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Empty(t, resp.Header.Get("Location"))
	require.Contains(t, string(b), "unknown_host")
}

// replacePair writes a new certificate and key over the old paths, as a renewal does (a rename, so
// a reader never sees half a file).
func replacePair(t *testing.T, dst, src testpki.Pair, keyMode os.FileMode) {
	t.Helper()
	for _, p := range [][2]string{{src.CertFile, dst.CertFile}, {src.KeyFile, dst.KeyFile}} {
		b, err := os.ReadFile(p[0])
		require.NoError(t, err)
		tmp := p[1] + ".new"
		require.NoError(t, os.WriteFile(tmp, b, 0o600))
		if p[1] == dst.KeyFile {
			require.NoError(t, os.Chmod(tmp, keyMode))
		}
		require.NoError(t, os.Rename(tmp, p[1]))
	}
}

// A renewed certificate written over the files is served without a restart: found by the
// periodic check, or at once on SIGHUP; a replacement whose key file others can read is refused
// and the current certificate kept.
func TestEdgeReloadsItsCertificateWithoutARestart(t *testing.T) {
	ca := testpki.NewCA(t, "edge")
	dir := t.TempDir()
	live := testpki.Pair{CertFile: filepath.Join(dir, "cert.pem"), KeyFile: filepath.Join(dir, "key.pem")}
	replacePair(t, live, ca.Server(t, "first", "*.workers.test"), 0o600)

	for _, how := range []string{"periodic", "SIGHUP"} {
		t.Run(how, func(t *testing.T) {
			every := time.Hour
			if how == "periodic" {
				every = 50 * time.Millisecond
			}
			h := runtimetest.Start(t, func(c *runtime.Config) {
				c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile, c.EdgeTLS.ReloadEvery = live.CertFile, live.KeyFile, every
			})
			subject := func() string {
				cert, err := peerCert(t, h.Info.EdgeAddr, "app.workers.test")
				require.NoError(t, err)
				return cert.Subject.CommonName
			}
			before := subject()
			renewed := "renewed-" + how
			replacePair(t, live, ca.Server(t, renewed, "*.workers.test"), 0o600)
			if how == "SIGHUP" {
				time.Sleep(100 * time.Millisecond)
				require.Equal(t, before, subject(), "no reload before the signal")
				require.NoError(t, syscall.Kill(os.Getpid(), syscall.SIGHUP))
			}
			require.Eventually(t, func() bool {
				cert, err := peerCert(t, h.Info.EdgeAddr, "app.workers.test")
				return err == nil && cert.Subject.CommonName == renewed
			}, 10*time.Second, 20*time.Millisecond)
			// The expiry the alert watches is the certificate served now.
			served, err := peerCert(t, h.Info.EdgeAddr, "app.workers.test")
			require.NoError(t, err)
			require.Contains(t, adminMetrics(t, h), fmt.Sprintf("takoform_runtime_edge_certificate_expiry_timestamp_seconds %g", float64(served.NotAfter.Unix())))

			// A key file others may read is refused: the renewed certificate stays.
			bad := ca.Server(t, "unsafe-"+how, "*.workers.test")
			replacePair(t, live, bad, 0o644)
			err = h.Node.ReloadEdgeCertificate()
			var unsafe *safedir.UnsafePathError
			require.ErrorAs(t, err, &unsafe)
			require.Equal(t, renewed, subject())
			require.Contains(t, h.Logs.String(), "kept the current certificate")
			require.NoError(t, os.Chmod(live.KeyFile, 0o600))
			require.NoError(t, h.Node.ReloadEdgeCertificate())
			require.Equal(t, "unsafe-"+how, subject())
		})
	}
}

// The node refuses to start with a key file others may read, a key that does not match its
// certificate, or contradictory flags.
func TestEdgeTLSRefusesUnsafeOrContradictoryConfig(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "wildcard", "*.workers.test")
	other := ca.Server(t, "other", "*.workers.test")
	readable := filepath.Join(t.TempDir(), "key.pem")
	b, err := os.ReadFile(pair.KeyFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(readable, b, 0o600))
	require.NoError(t, os.Chmod(readable, 0o640))
	start := func(o func(*runtime.Config)) error {
		cfg := runtime.Config{
			StateDir: filepath.Join(t.TempDir(), "runtime"), SealingKeyFile: runtimetest.SealingKeyFile(t),
			Workerd: workerdtest.Binary(t), InsecureNoSandbox: true,
			AdminListen: "127.0.0.1:0", EdgeListen: "127.0.0.1:0",
		}
		o(&cfg)
		n, err := runtime.Start(cfg)
		if err == nil {
			_ = n.Close()
			return errors.New("started")
		}
		return err
	}
	err = start(func(c *runtime.Config) { c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, readable })
	var unsafe *safedir.UnsafePathError
	require.ErrorAs(t, err, &unsafe)
	require.Contains(t, err.Error(), "0640")
	require.ErrorContains(t, start(func(c *runtime.Config) { c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, other.KeyFile }),
		"are not a certificate and its key")
	// A symlink to a private key of the node's user is fine (certbot's live/ directory).
	link := filepath.Join(t.TempDir(), "live-key.pem")
	require.NoError(t, os.Symlink(pair.KeyFile, link))
	require.EqualError(t, start(func(c *runtime.Config) { c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, link }), "started")
	require.ErrorContains(t, start(func(c *runtime.Config) { c.EdgeTLS.CertFile = pair.CertFile }), "go together")
	require.ErrorContains(t, start(func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile, c.EdgeTLS.ACME.Email = pair.CertFile, pair.KeyFile, "ops@example.test"
	}), "not both")
	require.ErrorContains(t, start(func(c *runtime.Config) { c.EdgeTLS.HTTPListen = "127.0.0.1:0" }), "needs --edge-tls-cert")
	require.ErrorContains(t, start(func(c *runtime.Config) { c.EdgeTLS.PublicHTTPSPort = 8443 }), "needs --edge-tls-cert")
	require.ErrorContains(t, start(func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile, c.EdgeTLS.PublicHTTPSPort = pair.CertFile, pair.KeyFile, 70000
	}), "not a TCP port")
	require.ErrorContains(t, start(func(c *runtime.Config) { c.EdgeTLS.ACME.CA = "https://127.0.0.1:1/dir" }), "need --edge-acme-email")
}

// HTTP/1.1 over TLS is held to the same framing rule as plain HTTP: a request carrying both
// Content-Length and Transfer-Encoding is refused (400) and its connection closed, so a request
// smuggled behind it is never answered; well-framed requests pipelined on one TLS connection are
// each answered, and the worker sees https.
func TestEdgeRefusesAmbiguousFramingOverHTTPS(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "wildcard", "*.workers.test")
	f := setup(t, func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, pair.KeyFile
	})
	const host = "echo.workers.test"
	f.putSource("echo", "uid-echo", echoSource)
	f.route(host, "echo", "ep-echo")
	f.waitReady("echo")
	roots := poolOf(t, ca.CertFile)
	dialTLS := func(t *testing.T, alpn []string) *rawConn {
		t.Helper()
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", f.h.Info.EdgeAddr,
			&tls.Config{RootCAs: roots, ServerName: host, NextProtos: alpn})
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return &rawConn{Conn: conn, br: bufio.NewReader(conn)}
	}

	for _, alpn := range [][]string{{"http/1.1"}, nil} {
		for _, head := range []string{
			"POST /echo HTTP/1.1\r\nHost: %s\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
			"POST /echo HTTP/1.1\r\nHost: %s\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n0\r\n\r\n",
			"POST /echo HTTP/1.0\r\nHost: %s\r\nConnection: keep-alive\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",
		} {
			conn := dialTLS(t, alpn)
			_, err := fmt.Fprintf(conn, head+"GET /smuggled HTTP/1.1\r\nHost: %s\r\n\r\n", host, host)
			require.NoError(t, err)
			resp, body := readResponse(t, conn)
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "ALPN %v, %q: %s", alpn, head, body)
			require.Contains(t, body, adminapi.CodeBadFraming)
			requireClosed(t, conn)
		}
	}

	conn := dialTLS(t, []string{"http/1.1"})
	_, err := fmt.Fprintf(conn, "POST /a HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"+
		"POST /b HTTP/1.1\r\nHost: %s\r\nContent-Length: 2\r\n\r\nxy"+
		"GET /c HTTP/1.1\r\nHost: %s\r\n\r\n", host, host, host)
	require.NoError(t, err)
	for _, want := range []string{"POST /a 3", "POST /b 2", "GET /c 0"} {
		resp, body := readResponse(t, conn)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
		var e echoed
		require.NoError(t, json.Unmarshal([]byte(body), &e))
		require.Equal(t, want, fmt.Sprintf("%s %s %d", e.Method, e.Path, e.Length))
		require.Equal(t, "https:", e.Scheme, "the worker sees the request came over HTTPS")
		require.Equal(t, "for=127.0.0.1;proto=https", e.Headers["forwarded"])
	}
}

// adminMetrics is the node's /metrics page, read with its admin token.
func adminMetrics(t *testing.T, h *runtimetest.Harness) string {
	t.Helper()
	token, err := os.ReadFile(h.Info.TokenFile)
	require.NoError(t, err)
	req, err := http.NewRequest(http.MethodGet, h.Info.AdminURL+adminapi.PathMetrics, nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(b))
	return string(b)
}
