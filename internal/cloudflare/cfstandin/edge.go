package cfstandin

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"

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
	if base != "" && strings.HasSuffix(host, "."+base) {
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
func (s *Server) serveNamespaceOf(w http.ResponseWriter, r *http.Request, ns string) {
	name := r.Header.Get(dispatch.ScriptHeader)
	r.Header.Del(dispatch.ScriptHeader)
	r.Header.Del(dispatch.CPUMsHeader)
	sc, found := s.NamespaceScript(ns, name)
	if name == "" || !found {
		w.Header().Set(dispatch.UnknownHeader, "1")
		w.WriteHeader(http.StatusNotFound)
		return
	}
	s.proxy(w, r, scriptKey{ns, name}, sc.Current.ID)
}

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
	addr, ok := s.runner.addr(key, versionID)
	if !ok {
		sc, found := s.NamespaceScript(key.Namespace, key.Name)
		if !found || sc.Current.ID != versionID {
			problem(w, http.StatusServiceUnavailable, "changing", "the worker changed while this request was routed; try again")
			return
		}
		p, err := s.runner.start(sc.Current)
		if errors.Is(err, errNoWorkerd) {
			problem(w, http.StatusServiceUnavailable, "no_runtime", "the stand-in runs no workerd, so workers do not answer")
			return
		}
		if err != nil {
			problem(w, http.StatusInternalServerError, "worker_failed", "the worker failed to start")
			return
		}
		s.runner.install(key, p)
		addr = p.addr
	}
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
	rp.ServeHTTP(w, r)
}

func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "code": code, "detail": detail,
	})
}
