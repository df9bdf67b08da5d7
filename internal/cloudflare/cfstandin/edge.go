package cfstandin

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
)

// DispatchProbeHeader asks the wfp-managed dispatch worker to look the hostname's route up and
// answer what it found, without dispatching (no user code runs): SPEC 8's Ready witness.
const DispatchProbeHeader = dispatch.ProbeHeader

// RouteEntry is the value of a routing KV entry of a wfp-managed installation (SPEC 8), keyed by
// hostname.
type RouteEntry = dispatch.RouteEntry

// serveEdge routes a request by its Host as Cloudflare's edge would for this account:
// `<script>.<accountSubdomain>.workers.dev` reaches an account script whose workers.dev route is
// enabled; `<label>.<baseDomain>` goes through the routing KV namespace (as the edge sees it, so
// possibly stale) to the script of that name in the dispatch namespace.
func (s *Server) serveEdge(w http.ResponseWriter, r *http.Request) {
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	s.mu.Lock()
	sub, base := s.cfg.AccountSubdomain, s.cfg.BaseDomain
	s.mu.Unlock()
	if suffix := "." + sub + ".workers.dev"; sub != "" && strings.HasSuffix(host, suffix) {
		name := strings.TrimSuffix(host, suffix)
		sc, ok := s.Script(name)
		if strings.Contains(name, ".") || !ok || !sc.Subdomain.Enabled {
			http.Error(w, "There is nothing here yet", http.StatusNotFound)
			return
		}
		s.proxy(w, r, scriptKey{"", name}, sc.Current.ID)
		return
	}
	if (base != "" && strings.HasSuffix(host, "."+base)) || s.servesCustomHostname(host) {
		s.dispatch(w, r)
		return
	}
	http.Error(w, "no worker is routed to "+host, http.StatusNotFound)
}

// dispatch hands a base-domain request to the product's own dispatch worker (package dispatch),
// running in workerd with its routing KV namespace served from the edge's view of KV (so stale
// for KVStale) and its dispatch namespace from this stand-in's scripts: what the stand-in proves
// on the base domain is the real dispatch worker's routing.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request) {
	if s.dispatcher == nil {
		problem(w, http.StatusServiceUnavailable, "no_runtime", "the stand-in runs no workerd, so the dispatch worker does not answer")
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	target := &url.URL{Scheme: "http", Host: s.dispatcher.Addr()}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set("X-Forwarded-Proto", scheme)
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			problem(w, http.StatusBadGateway, "dispatch_unreachable", "the dispatch worker did not answer")
		},
	}
	rp.ServeHTTP(w, r)
}

// serveRoutesKV answers the dispatch worker's ROUTES binding (workerd's KV protocol: GET /<key>)
// from the routing KV namespace as the edge sees it.
func (s *Server) serveRoutesKV(w http.ResponseWriter, r *http.Request) {
	key, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/"))
	if err != nil || r.Method != http.MethodGet {
		http.Error(w, "the routing namespace is read-only here", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	value, ok := s.edgeKV(s.cfg.RoutingKVNamespace, key)
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = w.Write(value)
}

// serveKVBinding answers an uploaded script's kv_namespace binding (workerd's KV protocol:
// GET /<key>) from namespace ns as the edge sees it; the binding is read-only here.
func (s *Server) serveKVBinding(w http.ResponseWriter, r *http.Request, ns string) {
	key, err := url.PathUnescape(strings.TrimPrefix(r.URL.EscapedPath(), "/"))
	if err != nil || r.Method != http.MethodGet {
		http.Error(w, "KV bindings are read-only in the stand-in", http.StatusMethodNotAllowed)
		return
	}
	s.mu.Lock()
	value, ok := s.edgeKV(ns, key)
	s.mu.Unlock()
	if !ok {
		http.NotFound(w, r)
		return
	}
	_, _ = w.Write(value)
}

// serveNamespace runs the script the dispatch worker's DISPATCHER stub names; an unknown one is
// answered with the header the stub turns into "Worker not found".
func (s *Server) serveNamespace(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ns := s.cfg.RoutingDispatchNamespace
	s.mu.Unlock()
	s.serveNamespaceOf(w, r, ns)
}

// serveNamespaceOf runs the script of dispatch namespace ns that the shim's stub names.
// The script runs under the CPU limit the dispatch set, as Cloudflare's dispatcher runs it: one
// that uses more CPU time than that is stopped, and the stub throws the dispatcher's exception.
func (s *Server) serveNamespaceOf(w http.ResponseWriter, r *http.Request, ns string) {
	name := r.Header.Get(dispatch.ScriptHeader)
	cpuMs, _ := strconv.ParseInt(r.Header.Get(dispatch.CPUMsHeader), 10, 64)
	r.Header.Del(dispatch.ScriptHeader)
	r.Header.Del(dispatch.CPUMsHeader)
	sc, found := s.NamespaceScript(ns, name)
	if name == "" || !found {
		w.Header().Set(dispatch.UnknownHeader, "1")
		w.WriteHeader(http.StatusNotFound)
		return
	}
	if cpuMs > 0 {
		s.proxyLimited(w, r, scriptKey{ns, name}, sc.Current.ID, time.Duration(cpuMs)*time.Millisecond)
		return
	}
	s.proxy(w, r, scriptKey{ns, name}, sc.Current.ID)
}

// proxyLimited is proxy under a CPU limit. The stand-in runs each script in a workerd process of
// its own, so the request's CPU time is the process's, sampled while the request runs and when its
// answer's headers arrive (the precision is the kernel's 10 ms tick; requests running at once on
// one script share the count). Past the limit the process is stopped (Cloudflare ends the
// isolate; the next request starts it again) and the answer carries the limit header.
func (s *Server) proxyLimited(w http.ResponseWriter, r *http.Request, key scriptKey, versionID string, limit time.Duration) {
	p, ok := s.ensure(w, key, versionID)
	if !ok {
		return
	}
	start, measured := p.cpuTime()
	over := func() bool {
		now, ok := p.cpuTime()
		return measured && ok && now-start > limit
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var exceeded atomic.Bool
	done := make(chan struct{})
	defer close(done)
	go func() {
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if over() {
					exceeded.Store(true)
					cancel()
					return
				}
			}
		}
	}()
	limited := func(w http.ResponseWriter) {
		s.runner.removeProc(key, p)
		w.Header().Set(dispatch.LimitHeader, "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	rp := s.reverseProxy(r, key, p.addr)
	rp.ModifyResponse = func(*http.Response) error {
		if exceeded.Load() || over() {
			exceeded.Store(true)
			return errCPULimit
		}
		return nil
	}
	rp.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) {
		if exceeded.Load() {
			limited(w)
			return
		}
		problem(w, http.StatusBadGateway, "worker_unreachable", "the worker did not answer")
	}
	rp.ServeHTTP(w, r.WithContext(ctx))
}

var errCPULimit = errors.New("the worker exceeded its CPU time limit")

// serveService answers the internal listener that service bindings reach: the header names the
// account script.
func (s *Server) serveService(w http.ResponseWriter, r *http.Request) {
	if ns := r.Header.Get(KVNamespaceHeader); ns != "" {
		s.serveKVBinding(w, r, ns)
		return
	}
	if ns := r.Header.Get(DispatchNamespaceHeader); ns != "" {
		r.Header.Del(DispatchNamespaceHeader)
		s.serveNamespaceOf(w, r, ns)
		return
	}
	name := r.Header.Get(ServiceHeader)
	r.Header.Del(ServiceHeader)
	sc, ok := s.Script(name)
	if !ok {
		problem(w, http.StatusNotFound, "no_route", "Worker not found: "+name)
		return
	}
	s.proxy(w, r, scriptKey{"", name}, sc.Current.ID)
}

// proxy sends the request to the workerd running version versionID of key, starting it again if
// it is not running (a workerd that exited).
func (s *Server) proxy(w http.ResponseWriter, r *http.Request, key scriptKey, versionID string) {
	p, ok := s.ensure(w, key, versionID)
	if !ok {
		return
	}
	s.reverseProxy(r, key, p.addr).ServeHTTP(w, r)
}

// ensure is the process running version versionID of key, started again if it is not running;
// when it cannot be, it answers w and reports false.
func (s *Server) ensure(w http.ResponseWriter, key scriptKey, versionID string) (*proc, bool) {
	if p, ok := s.runner.running(key, versionID); ok {
		return p, true
	}
	sc, found := s.NamespaceScript(key.Namespace, key.Name)
	if !found || sc.Current.ID != versionID {
		problem(w, http.StatusServiceUnavailable, "changing", "the worker changed while this request was routed; try again")
		return nil, false
	}
	p, err := s.runner.start(sc.Current)
	if errors.Is(err, errNoWorkerd) {
		problem(w, http.StatusServiceUnavailable, "no_runtime", "the stand-in runs no workerd, so workers do not answer")
		return nil, false
	}
	if err != nil {
		problem(w, http.StatusInternalServerError, "worker_failed", "the worker failed to start")
		return nil, false
	}
	s.runner.install(key, p)
	return p, true
}

// reverseProxy is the proxy of r to the workerd at addr serving key.
func (s *Server) reverseProxy(r *http.Request, key scriptKey, addr string) *httputil.ReverseProxy {
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	} else if key.Namespace != "" && r.Header.Get("X-Forwarded-Proto") == "https" {
		scheme = "https" // dispatched: the edge in front of the dispatch worker said so
	}
	target := &url.URL{Scheme: "http", Host: addr}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.Out.Host = pr.In.Host
			pr.Out.Header.Set("X-Forwarded-Proto", scheme)
			if ip, _, err := net.SplitHostPort(pr.In.RemoteAddr); err == nil {
				pr.Out.Header.Set("CF-Connecting-IP", ip)
			}
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			problem(w, http.StatusBadGateway, "worker_unreachable", "the worker did not answer")
		},
	}
	return rp
}

func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code, "detail": detail,
	})
}
