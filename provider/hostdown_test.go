package provider_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// stoppableFront stands in front of a Host on an address of its own. Armed, it passes one GET
// /v1/capabilities and then stops listening, so that what follows (the creates) meets a stopped
// Host: connections to its address are refused. start listens on the same address again.
type stoppableFront struct {
	t     *testing.T
	addr  string
	proxy http.Handler
	mu    sync.Mutex
	srv   *httptest.Server
	armed bool
	// down: the capabilities answer has gone; a request that still reaches the front on a
	// connection opened before is dropped unanswered, never passed to the Host.
	down bool
}

func newStoppableFront(t *testing.T, hostURL string) *stoppableFront {
	t.Helper()
	u, err := url.Parse(hostURL)
	require.NoError(t, err)
	f := &stoppableFront{t: t, proxy: httputil.NewSingleHostReverseProxy(u)}
	f.start()
	f.addr = f.srv.Listener.Addr().String()
	t.Cleanup(f.stop)
	return f
}

func (f *stoppableFront) start() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = false
	var srv *httptest.Server
	srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		down := f.down
		f.mu.Unlock()
		if down {
			if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
				conn.Close()
			}
			return
		}
		f.proxy.ServeHTTP(w, r)
		f.mu.Lock()
		stop := f.armed && r.URL.Path == "/v1/capabilities"
		f.armed = f.armed && !stop
		f.down = f.down || stop
		f.mu.Unlock()
		if stop {
			// Before this answer reaches the provider: no new connection is taken and this one
			// closes after the answer, so the creates that follow meet a stopped Host.
			srv.Config.SetKeepAlivesEnabled(false)
			_ = srv.Listener.Close()
			go f.stop()
		}
	}))
	if f.addr != "" {
		l, err := net.Listen("tcp", f.addr)
		require.NoError(f.t, err, "listen again on the Host's address")
		srv.Listener = l
	}
	srv.Start()
	f.srv = srv
}

func (f *stoppableFront) stop() {
	f.mu.Lock()
	srv := f.srv
	f.mu.Unlock()
	srv.Close()
}

func (f *stoppableFront) arm() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.armed = true
	// From here each connection carries one request: a create can then only meet a refused
	// connection (known not sent), never a connection opened before the stop that is closed under
	// it (which may have reached the Host, and is rightly retried until the resource's timeout;
	// seen once in CI, the apply then took the ten minutes).
	f.srv.Config.SetKeepAlivesEnabled(false)
}

const hostDownConfig = `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {
  unreachable_timeout = "8s"
}

resource "takoform_worker" "w" {
  count              = 3
  space              = "down"
  name               = "w${count.index}"
  main_module        = "index.js"
  modules            = { "index.js" = "export default { fetch() { return new Response('ok') } };" }
  compatibility_date = "2025-01-01"
}
`

// TestAccAStoppedHostIsSaidAndBounded: the Host stops during a create of several workers. The
// provider warns every WarnInterval in the log the CLI prints with TF_LOG=WARN, naming the
// endpoint and TAKOFORM_ENDPOINT, fails at unreachable_timeout rather than at the resources'
// ten-minute timeout with an error saying to re-run, and the re-run once the Host is back
// creates each worker once.
func TestAccAStoppedHostIsSaidAndBounded(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	front := newStoppableFront(t, h.URL)
	w := newWorkspace(t, front.srv.URL, h.Key, hostDownConfig, "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID, "TF_LOG=WARN")
	out, err := w.run("plan", "-input=false", "-no-color", "-out=tfplan")
	require.NoError(t, err, out)

	front.arm()
	start := time.Now()
	out, err = w.run("apply", "-input=false", "-no-color", "tfplan")
	took := time.Since(start)
	require.Error(t, err, out)
	require.Less(t, took, 40*time.Second, "the apply fails near unreachable_timeout (8s), not at the 10-minute create timeout:\n%s", out)
	warnings := regexp.MustCompile(`\[WARN\].*the Takoform Host at http://`+regexp.QuoteMeta(front.addr)+` \(from TAKOFORM_ENDPOINT\) has not answered for \d+s`).FindAllString(out, -1)
	require.GreaterOrEqual(t, len(warnings), 3, "a warning every 2s (a quarter of the 8s bound) in the CLI's output:\n%s", out)
	require.Contains(t, out, "Unable to create worker")
	require.Contains(t, out, "point TAKOFORM_ENDPOINT at it")
	require.Contains(t, out, "connection refused")
	require.Contains(t, out, "run the apply again: it is safe")
	require.NotContains(t, out, h.Key)

	front.start() // the Host is back on the same address
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	// (A create that waits on workerd longer than the warning interval may be warned about while
	// the Host works on it: the warning says no answer has come yet, which is then true.)
	require.NoError(t, err, out)
	require.NotContains(t, out, "Unable to create worker")
	var n int
	require.NoError(t, h.DB.QueryRow(ctx(t), `SELECT count(*) FROM workers WHERE organization_id = $1 AND space = 'down' AND status <> 'deleted'`,
		h.Organization.ID).Scan(&n))
	require.Equal(t, 3, n, "each worker once: the re-run neither orphaned nor duplicated any")
	require.Equal(t, 3, strings.Count(out, "Creation complete"), out)
}

// TestAccASilentHostDoesNotTaintASentCreate (SPEC 4, issue 32 item 5): the Host receives a
// worker's create and gives no answer for longer than unreachable_timeout (8 s) before it
// answers again. The create, which may have landed, is sent again with its token until the
// resource's timeout instead of being failed at the bound: the apply succeeds, nothing is
// tainted, and the re-plan is empty.
func TestAccASilentHostDoesNotTaintASentCreate(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	u, err := url.Parse(h.URL)
	require.NoError(t, err)
	proxy := httputil.NewSingleHostReverseProxy(u)
	var mu sync.Mutex
	var silentUntil time.Time
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if silentUntil.IsZero() && r.Method == http.MethodPut && strings.Contains(r.URL.Path, "/workers/") {
			silentUntil = time.Now().Add(14 * time.Second) // past the 8 s bound
		}
		until := silentUntil
		mu.Unlock()
		if time.Now().Before(until) {
			select { // received, never answered
			case <-time.After(time.Until(until)):
			case <-r.Context().Done():
				return
			}
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	config := strings.Replace(hostDownConfig, "count              = 3", "count              = 1", 1)
	w := newWorkspace(t, front.URL, h.Key, config, "TAKOFORM_ORGANIZATION_ID="+h.Organization.ID, "TF_LOG=WARN")
	start := time.Now()
	out, err := w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, "a sent create outlives the unreachable bound:\n%s", out)
	require.Greater(t, time.Since(start), 14*time.Second, "the Host was silent that long")
	require.Contains(t, out, "sent again with its ownership token")
	require.NotContains(t, out, "tainted")
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
}
