package dispatch_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

// routesKV serves workerd's KV protocol for the ROUTES binding from a map, and records each
// read's key and cacheTtl.
type routesKV struct {
	mu      sync.Mutex
	entries map[string]string
	reads   []kvRead
}

type kvRead struct {
	Key      string
	CacheTTL string
}

func (k *routesKV) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/"))
	if err != nil || r.Method != http.MethodGet {
		http.Error(w, "unexpected KV request", http.StatusBadRequest)
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.reads = append(k.reads, kvRead{Key: key, CacheTTL: r.URL.Query().Get("cache_ttl")})
	v, ok := k.entries[key]
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = io.WriteString(w, v)
}

func (k *routesKV) put(host string, e dispatch.RouteEntry) {
	raw, _ := json.Marshal(e)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.entries[host] = string(raw)
}

func (k *routesKV) readsSoFar() []kvRead {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.reads)
}

func (k *routesKV) lastRead() kvRead {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.reads[len(k.reads)-1]
}

// namespace stands for the dispatch namespace's scripts: each known script answers with its name,
// the CPU limit it was dispatched with and the Host header it saw; any other is unknown.
type namespace struct {
	mu         sync.Mutex
	scripts    map[string]bool
	dispatched []string
}

type answer struct {
	Script string `json:"script"`
	CPUMs  string `json:"cpuMs"`
	Host   string `json:"host"`
	Path   string `json:"path"`
}

func (n *namespace) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name := r.Header.Get(dispatch.ScriptHeader)
	n.mu.Lock()
	n.dispatched = append(n.dispatched, name)
	known := n.scripts[name]
	n.mu.Unlock()
	if !known {
		w.Header().Set(dispatch.UnknownHeader, "1")
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if name == "burns" {
		// Ran past the CPU limit it was dispatched with: the dispatcher throws.
		w.Header().Set(dispatch.LimitHeader, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if name == "throws" {
		http.Error(w, "tenant stack trace: secret-ish detail", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(answer{Script: name, CPUMs: r.Header.Get(dispatch.CPUMsHeader), Host: r.Host, Path: r.URL.Path})
}

func (n *namespace) dispatches() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.dispatched...)
}

type fixture struct {
	kv     *routesKV
	ns     *namespace
	worker *dispatch.Workerd
}

func setup(t *testing.T) fixture {
	t.Helper()
	return setupWithBinding(t, nil)
}

// setupWithBinding also serves the Binding entrypoint with props, as a caller's binding reaches it.
func setupWithBinding(t *testing.T, props *dispatch.BindingProps) fixture {
	t.Helper()
	f := fixture{kv: &routesKV{entries: map[string]string{}}, ns: &namespace{scripts: map[string]bool{}}}
	kvSrv := httptest.NewServer(f.kv)
	t.Cleanup(kvSrv.Close)
	nsSrv := httptest.NewServer(f.ns)
	t.Cleanup(nsSrv.Close)
	w, err := dispatch.StartWorkerdWithBinding(workerdtest.Binary(t), kvSrv.Listener.Addr().String(), nsSrv.Listener.Addr().String(), 75, props)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	f.worker = w
	return f
}

// get sends a request for host to the dispatch worker, as the base-domain route would.
func (f fixture) get(t *testing.T, host, path string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	return f.getAt(t, f.worker.Addr(), host, path, header)
}

func (f fixture) getAt(t *testing.T, addr, host, path string, header http.Header) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+addr+path, nil)
	require.NoError(t, err)
	req.Host = host
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res, body
}

func problemCode(t *testing.T, res *http.Response, body []byte) string {
	t.Helper()
	require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
	var p struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
	}
	require.NoError(t, json.Unmarshal(body, &p))
	require.Equal(t, res.StatusCode, p.Status)
	return p.Code
}

func TestTheDispatchWorkerRoutesAHostnameThroughItsKVEntryWithTheEntrysCPULimit(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.kv.put("tsw-abc.example.test", dispatch.RouteEntry{ScriptName: "tenant-a", EndpointUID: "ep-a", CPUMs: 50})
	f.kv.put("b.example.test", dispatch.RouteEntry{ScriptName: "tenant-b", EndpointUID: "ep-b"})
	f.ns.scripts["tenant-a"], f.ns.scripts["tenant-b"] = true, true

	res, body := f.get(t, "TSW-abc.example.test", "/some/path", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	var a answer
	require.NoError(t, json.Unmarshal(body, &a))
	require.Equal(t, answer{Script: "tenant-a", CPUMs: "50", Host: "tsw-abc.example.test", Path: "/some/path"}, a)
	require.Equal(t, []kvRead{{Key: "tsw-abc.example.test", CacheTTL: "75"}, {Key: "script:tenant-a", CacheTTL: "75"}}, f.kv.readsSoFar(),
		"the lookup is by lowercased hostname, then the script's own entry, with the installation's cacheTtl")

	res, body = f.get(t, "b.example.test", "/", nil)
	require.Equal(t, http.StatusOK, res.StatusCode)
	require.NoError(t, json.Unmarshal(body, &a))
	require.Equal(t, "tenant-b", a.Script)
	require.Empty(t, a.CPUMs, "an entry without cpuMs sets no limit")

	// Once the worker has a script entry, its limit is that entry's, whatever the route was
	// created with (the Host rewrites the script entry alone when the limit changes), and none
	// when the entry has none.
	f.kv.putScript("tenant-a", dispatch.ScriptEntry{WorkerUID: "uid-a", CPUMs: 80})
	_, body = f.get(t, "tsw-abc.example.test", "/", nil)
	require.NoError(t, json.Unmarshal(body, &a))
	require.Equal(t, "80", a.CPUMs)
	f.kv.putScript("tenant-a", dispatch.ScriptEntry{WorkerUID: "uid-a"})
	_, body = f.get(t, "tsw-abc.example.test", "/", nil)
	require.NoError(t, json.Unmarshal(body, &a))
	require.Empty(t, a.CPUMs, "a limit removed from the worker is removed from its routes")
}

func TestTheDispatchWorkerAnswersAnUnknownHostnameWithA404Problem(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.ns.scripts["tenant-a"] = true
	f.kv.entries["broken.example.test"] = `{"endpointUid":"ep"}`
	f.kv.entries["garbage.example.test"] = `not json`
	for _, host := range []string{"nobody.example.test", "broken.example.test", "garbage.example.test"} {
		res, body := f.get(t, host, "/", nil)
		require.Equal(t, http.StatusNotFound, res.StatusCode, host)
		require.Equal(t, "no_route", problemCode(t, res, body))
	}
	require.Empty(t, f.ns.dispatches(), "nothing was dispatched")
}

func TestTheDispatchWorkerAnswersAnUnknownScriptWithA404Problem(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.kv.put("gone.example.test", dispatch.RouteEntry{ScriptName: "deleted-script", EndpointUID: "ep"})
	res, body := f.get(t, "gone.example.test", "/", nil)
	require.Equal(t, http.StatusNotFound, res.StatusCode, string(body))
	require.Equal(t, "no_route", problemCode(t, res, body))
	require.Equal(t, []string{"deleted-script"}, f.ns.dispatches(), "the stub was asked and threw Worker not found")
}

func TestTheProbeHeaderIsAnsweredByTheLookupAloneWithoutDispatching(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.kv.put("tsw-abc.example.test", dispatch.RouteEntry{ScriptName: "tenant-a", EndpointUID: "ep-a", CPUMs: 50})
	f.ns.scripts["tenant-a"] = true
	res, body := f.get(t, "tsw-abc.example.test", "/", http.Header{dispatch.ProbeHeader: {"1"}})
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	var probe map[string]any
	require.NoError(t, json.Unmarshal(body, &probe))
	require.Equal(t, map[string]any{"hostname": "tsw-abc.example.test", "endpointUid": "ep-a"}, probe)
	require.Empty(t, f.ns.dispatches(), "no user code ran for the probe")

	res, body = f.get(t, "nobody.example.test", "/", http.Header{dispatch.ProbeHeader: {"1"}})
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	require.Equal(t, "no_route", problemCode(t, res, body))
}

func TestTheDispatchWorkerReadsKVWithAtLeastCloudflaresSmallestCacheTTL(t *testing.T) {
	t.Parallel()
	kv := &routesKV{entries: map[string]string{}}
	kvSrv := httptest.NewServer(kv)
	t.Cleanup(kvSrv.Close)
	w, err := dispatch.StartWorkerd(workerdtest.Binary(t), kvSrv.Listener.Addr().String(), "127.0.0.1:9", 5)
	require.NoError(t, err)
	t.Cleanup(w.Close)
	f := fixture{kv: kv, worker: w}
	res, _ := f.get(t, "x.example.test", "/", nil)
	require.Equal(t, http.StatusNotFound, res.StatusCode)
	require.Equal(t, strconv.Itoa(dispatch.MinCacheTTL), kv.lastRead().CacheTTL)
}

func TestAWorkerPastItsCPULimitIsAnsweredWithTheLimitProblem(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.kv.put("hot.example.test", dispatch.RouteEntry{ScriptName: "burns", EndpointUID: "ep", CPUMs: 10})
	f.ns.scripts["burns"] = true
	res, body := f.get(t, "hot.example.test", "/", nil)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, string(body))
	require.Equal(t, "worker_exceeded_limits", problemCode(t, res, body))
}

func (k *routesKV) putScript(name string, e dispatch.ScriptEntry) {
	raw, _ := json.Marshal(e)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.entries[dispatch.ScriptKey(name)] = string(raw)
}

func TestTheBindingEntrypointDispatchesToItsPropsCalleeWithTheCalleesCPULimit(t *testing.T) {
	t.Parallel()
	f := setupWithBinding(t, &dispatch.BindingProps{CalleeScript: "tenant-b", CalleeUID: "uid-b"})
	f.ns.scripts["tenant-a"], f.ns.scripts["tenant-b"] = true, true
	f.kv.put("a.example.test", dispatch.RouteEntry{ScriptName: "tenant-a", EndpointUID: "ep-a"})

	// Without the callee's script entry its limit is unknown: refused, nothing dispatched.
	res, body := f.getAt(t, f.worker.BindingAddr(), "a.example.test", "/x", nil)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, string(body))
	require.Equal(t, "binding_unavailable", problemCode(t, res, body))
	require.Empty(t, f.ns.dispatches())

	// An entry of another worker UID (the script name was taken by a replacement) is refused too.
	f.kv.putScript("tenant-b", dispatch.ScriptEntry{WorkerUID: "uid-other", CPUMs: 25})
	res, body = f.getAt(t, f.worker.BindingAddr(), "a.example.test", "/x", nil)
	require.Equal(t, http.StatusServiceUnavailable, res.StatusCode, string(body))
	require.Empty(t, f.ns.dispatches())

	f.kv.putScript("tenant-b", dispatch.ScriptEntry{WorkerUID: "uid-b", CPUMs: 25})
	// Whatever the request's hostname routes to, the binding reaches its props' callee only.
	res, body = f.getAt(t, f.worker.BindingAddr(), "a.example.test", "/x", nil)
	require.Equal(t, http.StatusOK, res.StatusCode, string(body))
	var a answer
	require.NoError(t, json.Unmarshal(body, &a))
	require.Equal(t, answer{Script: "tenant-b", CPUMs: "25", Host: "a.example.test", Path: "/x"}, a)
	require.Equal(t, kvRead{Key: "script:tenant-b", CacheTTL: "75"}, f.kv.lastRead())
}
