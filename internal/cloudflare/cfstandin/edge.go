package cfstandin

import (
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
)

// DispatchProbeHeader asks the wfp-managed dispatch path to look the hostname's route up and
// answer what it found, without dispatching (no user code runs): SPEC 8's Ready witness.
const DispatchProbeHeader = "Takoform-Dispatch-Probe"

// RouteEntry is the value of a routing KV entry of a wfp-managed installation (SPEC 8), keyed by
// hostname.
type RouteEntry struct {
	ScriptName  string `json:"scriptName"`
	EndpointUID string `json:"endpointUid"`
	CPUMs       int    `json:"cpuMs,omitempty"`
}

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
		s.dispatch(w, r, host)
		return
	}
	http.Error(w, "no worker is routed to "+host, http.StatusNotFound)
}

// dispatch is what SPEC 8's dispatch worker does for a base-domain hostname.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request, host string) {
	s.mu.Lock()
	raw, ok := s.edgeKV(s.cfg.RoutingKVNamespace, host)
	ns := s.cfg.RoutingDispatchNamespace
	s.mu.Unlock()
	var entry RouteEntry
	if ok && (json.Unmarshal(raw, &entry) != nil || entry.ScriptName == "") {
		ok = false
	}
	if !ok {
		problem(w, http.StatusNotFound, "no_route", "no worker is routed to "+host)
		return
	}
	if r.Header.Get(DispatchProbeHeader) != "" {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"hostname": host, "endpointUid": entry.EndpointUID, "scriptName": entry.ScriptName})
		return
	}
	sc, found := s.NamespaceScript(ns, entry.ScriptName)
	if !found {
		problem(w, http.StatusNotFound, "no_route", "Worker not found: "+entry.ScriptName)
		return
	}
	s.proxy(w, r, scriptKey{ns, entry.ScriptName}, sc.Current.ID)
}

// serveService answers the internal listener that service bindings reach: the header names the
// account script.
func (s *Server) serveService(w http.ResponseWriter, r *http.Request) {
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
