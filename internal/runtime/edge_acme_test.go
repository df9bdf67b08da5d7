package runtime_test

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// pebble is Pebble, the ACME test server, run in-process: its directory over HTTPS (a testpki
// certificate), a validation authority that really performs TLS-ALPN-01 against the edge (names
// resolved by a DNS server that answers 127.0.0.1 for every name), and a record of every order's
// identifiers as Pebble received them.
type pebble struct {
	dirURL   string
	caFile   string // the CA of the directory's own HTTPS certificate
	roots    *x509.CertPool
	mu       sync.Mutex
	ordered  []string
	requests int
}

func (p *pebble) orders() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.ordered...)
}

func startPebble(t *testing.T, edgePort int) *pebble { return startPebbleOn(t, 1, edgePort) }

// startPebbleOn is startPebble validating HTTP-01 on httpPort and TLS-ALPN-01 on tlsPort (port 1:
// nothing answers there).
func startPebbleOn(t *testing.T, httpPort, tlsPort int) *pebble {
	t.Helper()
	// Before va.New and wfe.New read them: validate at once, never refuse a good nonce.
	t.Setenv("PEBBLE_VA_NOSLEEP", "1")
	t.Setenv("PEBBLE_WFE_NONCEREJECT", "0")
	logger := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		logger = log.New(os.Stderr, "pebble ", log.Lmicroseconds)
	}
	dnsL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dnsSrv := &dns.Server{Listener: dnsL, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		for _, question := range q.Question {
			if question.Qtype == dns.TypeA {
				m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: question.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 0}, A: net.IPv4(127, 0, 0, 1)})
			}
		}
		_ = w.WriteMsg(m)
	})}
	go func() { _ = dnsSrv.ActivateAndServe() }()
	t.Cleanup(func() { _ = dnsSrv.Shutdown() })

	store := db.NewMemoryStore()
	authority := ca.New(logger, store, "", "ecdsa", 0, 1, map[string]ca.Profile{"default": {Description: "default"}})
	validator := va.New(logger, httpPort, tlsPort, false, dnsL.Addr().String(), store)
	front := wfe.New(logger, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 0, 0)
	p := &pebble{}
	handler := front.Handler()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		p.requests++
		p.mu.Unlock()
		if r.Method == http.MethodPost && r.URL.Path == "/order-plz" {
			p.record(t, r)
		}
		handler.ServeHTTP(w, r)
	}))
	pki := testpki.NewCA(t, "pebble-https")
	pair := pki.Server(t, "pebble", "127.0.0.1")
	cert, err := tls.LoadX509KeyPair(pair.CertFile, pair.KeyFile)
	require.NoError(t, err)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	p.dirURL, p.caFile = srv.URL+wfe.DirectoryPath, pki.CertFile
	p.roots = x509.NewCertPool()
	p.roots.AddCert(authority.GetRootCert(0).Cert)
	return p
}

// record notes the identifiers of one new-order request (a JWS whose payload names them).
func (p *pebble) record(t *testing.T, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	r.Body = io.NopCloser(bytes.NewReader(body))
	var jws struct{ Payload string }
	require.NoError(t, json.Unmarshal(body, &jws))
	payload, err := base64.RawURLEncoding.DecodeString(jws.Payload)
	require.NoError(t, err)
	var order struct{ Identifiers []struct{ Value string } }
	require.NoError(t, json.Unmarshal(payload, &order))
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range order.Identifiers {
		p.ordered = append(p.ordered, id.Value)
	}
}

// On-demand ACME: a routed hostname gets a certificate from the CA during its first handshake
// and answers over HTTPS (HTTP/2); a hostname with no route fails its handshake and the CA sees
// no order for it; beyond the order limit a routed hostname is refused too, with no order; the
// certificate and the account key stay in the private acme/ directory (0700/0600), and a
// restarted node serves from there without a new order.
func TestEdgeACMEOrdersOnlyForRoutedHostnames(t *testing.T) {
	edgeL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	edgePort := edgeL.Addr().(*net.TCPAddr).Port
	p := startPebble(t, edgePort)
	f := setup(t, func(c *runtime.Config) {
		c.EdgeListener = edgeL
		c.EdgeTLS.ACME = edge.ACMEOptions{Email: "ops@example.test", CA: p.dirURL, CARoot: p.caFile, OrdersPerHour: 1}
	})
	require.Equal(t, "https", f.h.Info.EdgeScheme)
	f.script("acme-1", "uid-acme-1", 1, "v1")
	f.route("app.workers.test", "acme-1", "ep-acme-1")
	f.waitReady("acme-1")
	url := func(host string) string { return "https://" + host + ":" + strconv.Itoa(edgePort) + "/" }

	// A hostname with no route: the handshake fails, nothing is ordered.
	_, err = peerCert(t, f.h.Info.EdgeAddr, "stranger.workers.test")
	require.Empty(t, p.orders(), "no order for a hostname the node does not route")
	require.Error(t, err)

	started := time.Now()
	resp, body := getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, p.roots, true), url("app.workers.test"))
	t.Logf("first HTTPS request, certificate ordered and issued on demand: %s", time.Since(started))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, expectReply("v1", ""), body)
	require.Equal(t, 2, resp.ProtoMajor)
	require.Equal(t, []string{"app.workers.test"}, p.orders())

	// The order limit (one an hour here) holds back a second routed hostname: no order reaches
	// the CA; the first hostname's certificate is served from the cache without one.
	f.route("two.workers.test", "acme-1", "ep-acme-2")
	_, err = peerCert(t, f.h.Info.EdgeAddr, "two.workers.test")
	require.Equal(t, []string{"app.workers.test"}, p.orders(), "no order beyond the limit")
	require.Error(t, err)
	require.Contains(t, f.h.Logs.String(), "order limit")
	resp, _ = getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, p.roots, true), url("app.workers.test"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, []string{"app.workers.test"}, p.orders())

	// Everything ACME keeps is private (SPEC 6.3): the account key and the certificate's key are
	// files of mode 0600 in directories of mode 0700.
	acmeDir := filepath.Join(f.h.StateDir, edge.ACMEDir)
	require.NoError(t, safedir.Check(acmeDir, safedir.Current()))
	var keys []string
	require.NoError(t, filepath.WalkDir(acmeDir, func(path string, d fs.DirEntry, err error) error {
		require.NoError(t, err)
		info, err := d.Info()
		require.NoError(t, err)
		if d.IsDir() {
			require.Equal(t, fs.FileMode(0o700), info.Mode().Perm(), path)
		} else {
			require.Equal(t, fs.FileMode(0o600), info.Mode().Perm(), path)
			if filepath.Ext(path) == ".key" {
				keys = append(keys, filepath.Base(path))
			}
		}
		return nil
	}))
	require.Contains(t, keys, "app.workers.test.key")
	require.Len(t, keys, 2, "the account key and one certificate key: %v", keys)

	// A restarted node (new ports) loads the certificate from its state directory: no new order.
	f.h.Restart(t)
	f.reconnect()
	f.waitReady("acme-1")
	resp, body = getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, p.roots, true), "https://app.workers.test/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, expectReply("v1", ""), body)
	require.Equal(t, []string{"app.workers.test"}, p.orders())
}

// One organization's hostnames spend at most its share of the node's ACME orders (SPEC 3.7: a
// per-organization order budget): past it, its next routed hostname's handshake fails with no
// order, while another organization's hostname is still ordered.
func TestEdgeACMEOrdersAreBudgetedPerOrganization(t *testing.T) {
	edgeL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	edgePort := edgeL.Addr().(*net.TCPAddr).Port
	p := startPebble(t, edgePort)
	f := setup(t, func(c *runtime.Config) {
		c.EdgeListener = edgeL
		c.EdgeTLS.ACME = edge.ACMEOptions{Email: "ops@example.test", CA: p.dirURL, CARoot: p.caFile, OrdersPerHour: 10, OrdersPerOrganizationPerHour: 1}
	})
	f.orgScript("shop-a", "org-a", "uid-shop-a", loopingSource)
	f.orgScript("shop-b", "org-b", "uid-shop-b", loopingSource)
	f.route("a1.example.com", "shop-a", "ep-a1")
	f.route("a2.example.com", "shop-a", "ep-a2")
	f.route("b1.example.com", "shop-b", "ep-b1")
	f.waitReady("shop-a")
	f.waitReady("shop-b")
	client := httpsClient(t, f.h.Info.EdgeAddr, p.roots, true)
	url := func(host string) string { return "https://" + host + ":" + strconv.Itoa(edgePort) + "/" }

	resp, _ := getTLS(t, client, url("a1.example.com"))
	require.Equal(t, http.StatusOK, resp.StatusCode)
	_, err = peerCert(t, f.h.Info.EdgeAddr, "a2.example.com")
	require.Error(t, err, "org-a's second hostname is past its hour's share")
	require.Contains(t, f.h.Logs.String(), "organization for this hour")
	resp, _ = getTLS(t, client, url("b1.example.com"))
	require.Equal(t, http.StatusOK, resp.StatusCode, "another organization still gets its certificate")
	require.Equal(t, []string{"a1.example.com", "b1.example.com"}, p.orders())
}

// HTTP-01 is answered on the plain-HTTP listener (SPEC 3.7: ACME on demand by TLS-ALPN-01 or
// HTTP-01): with only it asked for, and the CA unable to reach the edge's TLS port, the first
// HTTPS request to a routed hostname still gets its certificate, and the listener keeps
// redirecting other paths.
func TestEdgeACMEAnswersHTTP01OnThePlainHTTPListener(t *testing.T) {
	edgeL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	httpL, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	edgePort := edgeL.Addr().(*net.TCPAddr).Port
	p := startPebbleOn(t, httpL.Addr().(*net.TCPAddr).Port, 1)
	f := setup(t, func(c *runtime.Config) {
		c.EdgeListener = edgeL
		c.EdgeTLS.HTTPListener = httpL
		c.EdgeTLS.ACME = edge.ACMEOptions{Email: "ops@example.test", CA: p.dirURL, CARoot: p.caFile, Challenges: []string{edge.ChallengeHTTP}}
	})
	f.script("acme-http", "uid-acme-http", 1, "v1")
	f.route("plain.example.com", "acme-http", "ep-acme-http")
	f.waitReady("acme-http")
	resp, body := getTLS(t, httpsClient(t, f.h.Info.EdgeAddr, p.roots, true), "https://plain.example.com:"+strconv.Itoa(edgePort)+"/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, expectReply("v1", ""), body)
	require.Equal(t, []string{"plain.example.com"}, p.orders())

	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest(http.MethodGet, "http://"+httpL.Addr().String()+"/path", nil)
	require.NoError(t, err)
	req.Host = "plain.example.com"
	r, err := noRedirect.Do(req)
	require.NoError(t, err)
	r.Body.Close()
	require.Equal(t, http.StatusPermanentRedirect, r.StatusCode, "other paths are still redirected")
}
