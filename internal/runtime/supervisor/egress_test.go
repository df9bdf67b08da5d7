package supervisor

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// fetchWorker fetches ?t= (n times at once with ?n=) and reports what each fetch() gave it.
const fetchWorker = `export default {
  async fetch(req) {
    const u = new URL(req.url);
    const target = u.searchParams.get("t");
    const n = Number(u.searchParams.get("n") || "1");
    const one = async () => {
      try {
        const r = await fetch(target);
        return { status: r.status, body: (await r.text()).slice(0, 500) };
      } catch (e) {
        return { status: 0, body: String(e) };
      }
    };
    const results = await Promise.all(Array.from({ length: n }, one));
    return Response.json(results);
  }
};`

type fetched struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
}

func egressSpec(t *testing.T, deny []string) Spec {
	t.Helper()
	files, err := workerd.Render(workerd.Worker{
		Modules: map[string]string{"main.js": fetchWorker}, MainModule: "main.js", CompatibilityDate: "2024-09-23", Deny: deny,
	}, ConfigFile, ConfigConst, SocketName)
	require.NoError(t, err)
	base := filepath.Join(t.TempDir(), "incarnations")
	require.NoError(t, safedir.Ensure(base, safedir.Current()))
	return Spec{ID: "inc-egress", Script: "s", Dir: filepath.Join(base, "inc-egress"), Files: files}
}

func fetchThrough(t *testing.T, inc *Incarnation, target string, n int) []fetched {
	t.Helper()
	out, err := tryFetchThrough(inc, target, n)
	require.NoError(t, err)
	return out
}

// tryFetchThrough is fetchThrough returning its error, for goroutines other than the test's.
func tryFetchThrough(inc *Incarnation, target string, n int) ([]fetched, error) {
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + inc.Addr() + "/?n=" + itoa(n) + "&t=" + url.QueryEscape(target))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []fetched
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return nil, err
	}
	if len(out) != n {
		return nil, fmt.Errorf("%d results for %d subrequests", len(out), n)
	}
	return out, nil
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// countingListener counts the connections that reach it.
func countingListener(t *testing.T, addr string) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	var n atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("reached")) }),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				n.Add(1)
			}
		}}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), &n
}

// nodeAddress is a non-loopback IPv4 address of this machine (traffic to it stays on the machine).
func nodeAddress(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.String()
		}
	}
	t.Skip("this machine has no non-loopback IPv4 address")
	return ""
}

// requireRefusedByWorkerd checks that the worker got the dialer's refusal and that workerd's log
// says it refused the address (before connecting: its network rule is checked on the address).
func requireRefusedByWorkerd(t *testing.T, log *syncBuffer, target, refusedAddr string, got fetched) {
	t.Helper()
	require.Equal(t, http.StatusBadGateway, got.Status, "%s: %s", target, got.Body)
	require.Contains(t, got.Body, "egress_refused", target)
	waitFor(t, "workerd logs its refusal of "+refusedAddr, func() bool {
		return strings.Contains(log.String(), "connecting to "+refusedAddr+" is not allowed")
	})
}

// syncBuffer collects a logger's output.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func loggedOptions(t *testing.T) (Options, *syncBuffer) {
	opts := options(t)
	log := &syncBuffer{}
	opts.Logger = slog.New(slog.NewTextHandler(log, nil))
	return opts, log
}

func TestWorkersCannotReachLoopbackPrivateMetadataOrTheNodeItself(t *testing.T) {
	t.Parallel()
	loopback, loopbackHits := countingListener(t, "127.0.0.1:0")
	own, ownHits := countingListener(t, net.JoinHostPort(nodeAddress(t), "0"))
	deny, err := egress.DenyList(nil, nil)
	require.NoError(t, err)
	opts, log := loggedOptions(t)
	inc, err := Start(egressSpec(t, deny), opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	for target, refused := range map[string]string{
		"http://" + loopback + "/":                 loopback,
		"http://10.1.2.3/":                         "10.1.2.3:80",
		"http://192.168.7.8/":                      "192.168.7.8:80",
		"https://172.16.0.9/":                      "172.16.0.9:443", // the dialer restored https
		"http://169.254.169.254/latest/meta-data/": "169.254.169.254:80",
		"http://" + own + "/":                      own,
		"http://[::1]:" + port(loopback) + "/":     "::1:" + port(loopback), // workerd writes IPv6 without brackets
	} {
		requireRefusedByWorkerd(t, log, target, refused, fetchThrough(t, inc, target, 1)[0])
	}
	require.Zero(t, loopbackHits.Load(), "nothing reached the loopback listener")
	require.Zero(t, ownHits.Load(), "nothing reached the node's own address")
}

func TestEgressDenyRangeIsRefused(t *testing.T) {
	t.Parallel()
	ip := nodeAddress(t)
	own, hits := countingListener(t, net.JoinHostPort(ip, "0"))
	// Only the operator's range: the node's own address is denied here by --egress-deny alone.
	deny, err := egress.ParseDeny([]string{ip + "/30"})
	require.NoError(t, err)
	opts, log := loggedOptions(t)
	inc, err := Start(egressSpec(t, deny), opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	requireRefusedByWorkerd(t, log, own, own, fetchThrough(t, inc, "http://"+own+"/", 1)[0])
	require.Zero(t, hits.Load())
}

// holdingEdge stands in for the node's edge: it serves one hostname and holds every request until
// released, so that subrequests pile up in flight.
type holdingEdge struct {
	arrived atomic.Int64
	release chan struct{}
}

func (h *holdingEdge) Serves(host string) bool { return host == "slow.test" }

func (h *holdingEdge) ServeEgress(w http.ResponseWriter, _ *http.Request) {
	h.arrived.Add(1)
	<-h.release
	_, _ = w.Write([]byte("done"))
}

func TestConcurrentSubrequestsBeyondTheCapAreRefused(t *testing.T) {
	t.Parallel()
	local := &holdingEdge{release: make(chan struct{})}
	opts := options(t)
	opts.Local = local
	inc, err := Start(egressSpec(t, nil), opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	const n = egress.DefaultSubrequestLimit + 10
	type result struct {
		fetched []fetched
		err     error
	}
	results := make(chan result, 1)
	go func() {
		out, err := tryFetchThrough(inc, "http://slow.test/", n)
		results <- result{out, err}
	}()
	// The cap's worth arrive and are held; the rest are refused by the proxy at once, so once
	// all n are accounted for (held or refused), nothing more is on its way.
	waitFor(t, "every subrequest held or refused", func() bool {
		_, refused := inc.Subrequests()
		return local.arrived.Load()+refused >= n
	})
	inFlight, refused := inc.Subrequests()
	require.EqualValues(t, egress.DefaultSubrequestLimit, inFlight)
	require.EqualValues(t, egress.DefaultSubrequestLimit, local.arrived.Load(), "no subrequest past the cap reached the edge")
	close(local.release)
	r := <-results
	require.NoError(t, r.err)
	byStatus := map[int]int{}
	for _, f := range r.fetched {
		byStatus[f.Status]++
	}
	require.Equal(t, map[int]int{http.StatusOK: egress.DefaultSubrequestLimit, http.StatusTooManyRequests: 10}, byStatus)
	require.EqualValues(t, 10, refused)
	require.EqualValues(t, egress.DefaultSubrequestLimit, local.arrived.Load())
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// bindingWorker calls its AUTH binding ?n= times at once and reports what each call gave it.
const bindingWorker = `export default {
  async fetch(req, env) {
    const n = Number(new URL(req.url).searchParams.get("n") || "1");
    const one = async () => {
      const r = await env.AUTH.fetch("http://auth.internal/");
      return { status: r.status, body: (await r.text()).slice(0, 500) };
    };
    return Response.json(await Promise.all(Array.from({ length: n }, one)));
  }
};`

// holdingRouter holds every binding call until released.
type holdingRouter struct {
	arrived atomic.Int64
	release chan struct{}
}

func (h *holdingRouter) ServeBinding(w http.ResponseWriter, _ *http.Request, from *Incarnation, binding string) {
	h.arrived.Add(1)
	<-h.release
	_, _ = w.Write([]byte(from.Callee(binding)))
}

// Calls through a service binding are subrequests of the worker like its fetch()es: past the cap
// they are refused (429) before they reach the node's router.
func TestConcurrentBindingCallsBeyondTheCapAreRefused(t *testing.T) {
	t.Parallel()
	router := &holdingRouter{release: make(chan struct{})}
	opts := options(t)
	opts.Bindings = router
	callees := map[string]string{"AUTH": "0b9c6f1e-2f53-4d8e-9a3c-000000000001"}
	files, err := workerd.Render(workerd.Worker{
		Modules: map[string]string{"main.js": bindingWorker}, MainModule: "main.js", CompatibilityDate: "2024-09-23",
		Settings: workerconf.Settings{ServiceBindings: callees},
	}, ConfigFile, ConfigConst, SocketName)
	require.NoError(t, err)
	base := filepath.Join(t.TempDir(), "incarnations")
	require.NoError(t, safedir.Ensure(base, safedir.Current()))
	inc, err := Start(Spec{ID: "inc-bind", Script: "s", Dir: filepath.Join(base, "inc-bind"), Files: files, Callees: callees}, opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	const n = egress.DefaultSubrequestLimit + 10
	type result struct {
		fetched []fetched
		err     error
	}
	results := make(chan result, 1)
	go func() {
		out, err := tryFetchThrough(inc, "unused", n)
		results <- result{out, err}
	}()
	waitFor(t, "every binding call held or refused", func() bool {
		_, refused := inc.Subrequests()
		return router.arrived.Load()+refused >= n
	})
	inFlight, refused := inc.Subrequests()
	require.EqualValues(t, egress.DefaultSubrequestLimit, inFlight)
	require.EqualValues(t, egress.DefaultSubrequestLimit, router.arrived.Load(), "no call past the cap reached the router")
	close(router.release)
	r := <-results
	require.NoError(t, r.err)
	byStatus := map[int]int{}
	for _, f := range r.fetched {
		byStatus[f.Status]++
		if f.Status == http.StatusOK {
			require.Equal(t, "0b9c6f1e-2f53-4d8e-9a3c-000000000001", f.Body)
		} else {
			require.Contains(t, f.Body, "subrequest_limit")
		}
	}
	require.Equal(t, map[int]int{http.StatusOK: egress.DefaultSubrequestLimit, http.StatusTooManyRequests: 10}, byStatus)
	require.EqualValues(t, 10, refused)
}
