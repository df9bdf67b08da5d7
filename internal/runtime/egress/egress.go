// Package egress is the runtime node's outbound path for workers (SPEC 5.1 "Egress"): the deny
// list every generated config carries, and the per-incarnation egress proxy that a worker's
// fetch() reaches through workerd's globalOutbound.
//
// workerd itself refuses non-public addresses (its "public" rule) and whatever the config's deny
// list names, before any packet leaves; it has no limit on concurrent subrequests and no loop
// header. The proxy adds both: it counts one incarnation's subrequests in flight and refuses those
// beyond the cap, and it hands a subrequest for a hostname this node serves straight to the edge,
// marked as coming from this node's egress, so that the edge can stop a worker calling itself
// round and round. Everything else goes back into the same workerd process on its outbound socket,
// where the network service applies the deny list.
package egress

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// DefaultSubrequestLimit caps one incarnation's concurrent subrequests (SPEC 5.1).
const DefaultSubrequestLimit = 50

// ParseDeny checks --egress-deny values and returns them in canonical CIDR form.
func ParseDeny(values []string) ([]string, error) {
	out := make([]string, 0, len(values))
	for _, v := range values {
		_, network, err := net.ParseCIDR(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("--egress-deny %q is not a CIDR (for example 203.0.113.0/24 or 2001:db8::/32)", v)
		}
		out = append(out, network.String())
	}
	return out, nil
}

// DenyList is what a config denies beyond workerd's own "public" rule and workerd.FixedDeny:
// every address of this node's interfaces and of its published edge, as /32 or /128 (workerd's
// "public" admits documentation and other ranges a node may well be numbered in, which is how a
// worker reached its own node), and the operator's ranges. Sorted, so that the same addresses give
// the same list.
func DenyList(published []string, extra []string) ([]string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list this node's addresses for the egress deny list: %w", err)
	}
	var ips []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			ips = append(ips, n.IP)
		}
	}
	for _, p := range published {
		host := p
		if h, _, err := net.SplitHostPort(p); err == nil {
			host = h
		}
		if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
			ips = append(ips, ip)
		}
	}
	seen := map[string]bool{}
	var out []string
	add := func(s string) {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	for _, ip := range ips {
		if v4 := ip.To4(); v4 != nil {
			add(v4.String() + "/32")
		} else {
			add(ip.String() + "/128")
		}
	}
	for _, c := range extra {
		add(c)
	}
	sort.Strings(out)
	return out, nil
}

// Local is this node's edge as the egress proxy sees it.
type Local interface {
	// Serves reports whether the edge routes this (normalized) hostname.
	Serves(hostname string) bool
	// ServeEgress serves a request that came from this node's own egress.
	ServeEgress(w http.ResponseWriter, r *http.Request)
}

// Proxy is one incarnation's egress proxy. workerd sends it proxy-style requests (absolute URLs).
type Proxy struct {
	// Caller names the script whose incarnation this proxy serves: the edge counts loops per
	// caller.
	Caller   string
	limit    int64
	local    Local
	out      *httputil.ReverseProxy
	inflight atomic.Int64
	refused  atomic.Int64
}

// NewProxy returns the proxy of one incarnation whose workerd serves its outbound socket at
// outboundAddr. limit ≤ 0 takes DefaultSubrequestLimit; local may be nil (nothing is routed
// in-process).
func NewProxy(outboundAddr string, limit int, local Local) *Proxy {
	if limit <= 0 {
		limit = DefaultSubrequestLimit
	}
	outbound := &url.URL{Scheme: "http", Host: outboundAddr}
	p := &Proxy{limit: int64(limit), local: local}
	p.out = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			// The outbound socket speaks plain proxy-style HTTP; the dialer restores https from the
			// header (a worker's own copy of the header is dropped first).
			pr.Out.Header.Del(workerd.SchemeHeader)
			pr.Out.Header.Del(workerd.ProbeHeader)
			if pr.In.URL.Scheme == "https" {
				pr.Out.URL.Scheme = "http"
				pr.Out.Header.Set(workerd.SchemeHeader, "https")
			}
			pr.Out.Host = pr.In.URL.Host
		},
		Transport: &http.Transport{
			Proxy:               func(*http.Request) (*url.URL, error) { return outbound, nil },
			MaxIdleConnsPerHost: limit,
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			writeProblem(w, adminapi.NewProblem(http.StatusBadGateway, adminapi.CodeEgressRefused, "Bad Gateway",
				"the runtime node could not complete this subrequest"))
		},
	}
	return p
}

// InFlight is the number of subrequests being served.
func (p *Proxy) InFlight() int64 { return p.inflight.Load() }

// Refused counts subrequests refused by the cap.
func (p *Proxy) Refused() int64 { return p.refused.Load() }

// Admitted serves h as one more subrequest of the incarnation when its cap allows, and refuses it
// (429) otherwise. The proxy's own requests and those the worker sends through its service
// bindings share the one cap (SPEC 5.1).
func (p *Proxy) Admitted(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The cap counts a subrequest until its response has been copied back whole (or the
		// worker went away), which is when h returns.
		if p.inflight.Add(1) > p.limit {
			p.inflight.Add(-1)
			p.refused.Add(1)
			w.Header().Set("Retry-After", "1")
			writeProblem(w, adminapi.NewProblem(http.StatusTooManyRequests, adminapi.CodeSubrequestLimit, "Too Many Requests",
				fmt.Sprintf("this worker already has %d subrequests in flight, the most a runtime node allows", p.limit)))
			return
		}
		defer p.inflight.Add(-1)
		h.ServeHTTP(w, r)
	})
}

// ServeHTTP serves one subrequest of the incarnation, admitted or refused by the cap.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p.Admitted(http.HandlerFunc(p.forward)).ServeHTTP(w, r)
}

// forward serves one admitted subrequest.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request) {
	if !r.URL.IsAbs() || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		writeProblem(w, adminapi.NewProblem(http.StatusBadRequest, adminapi.CodeEgressRefused, "Bad Request",
			"the runtime node carries only http and https subrequests"))
		return
	}
	if p.local != nil {
		if host := edge.Hostname(r.URL.Host); p.local.Serves(host) {
			// A hostname this node serves never leaves it (its own addresses are denied anyway):
			// the edge serves it, knowing where it came from.
			in := r.Clone(edge.WithCaller(r.Context(), p.Caller))
			in.Host = r.URL.Host
			in.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
			in.RequestURI = in.URL.RequestURI()
			in.Header.Del(workerd.SchemeHeader)
			p.local.ServeEgress(w, in)
			return
		}
	}
	p.out.ServeHTTP(w, r)
}

func writeProblem(w http.ResponseWriter, p *adminapi.Problem) {
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
