// Package edge is the runtime node's public face: a reverse proxy that routes each request by its
// Host header to the Ready incarnation of the route's script (SPEC 5). Any other host gets a 404
// problem; a route whose script has no Ready incarnation gets a 503 problem. It serves clients'
// HTTP/1.x with a loop and a strict parser of its own (Server, h1.go, h1parse.go), on plain TCP
// and over TLS (TLSListener completes the handshakes; HTTP/2 connections go to net/http's server,
// which serves HTTP/2 only), holds every client to the limits of SPEC 5.1 (Limits), and speaks
// HTTP/1.1 to workerd on keep-alive connections of its own (forward.go, upstream.go).
//
// Workers' own subrequests for hostnames this node serves come in through ServeEgress (the egress
// proxy hands them over in-process; they never leave the node). workerd drops a request's headers
// when a worker builds a new one, so a loop cannot be told by a header: the edge counts, per
// script, the requests from its own egress in flight, and answers 508 beyond MaxEgressLoop
// (SPEC 5.1).
package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// Target is one incarnation where it serves: its process's socket ("unix:PATH", or host:port),
// and the id its process's router loads it under (sent as Takoform-Incarnation; "" sends none).
// Acquire counts a request in flight and fails once the target is retired (draining, or moved to
// another process), so the edge looks the route up again and reaches its successor.
type Target interface {
	Addr() string
	Script() string
	Incarnation() string
	Acquire() (Flight, bool)
}

// Flight is one request on a target. Answered says the worker's answer began (a witness of
// liveness beside the probe: a worker busy answering is not stuck); Done ends the request,
// answered or not (a request that ends unanswered may have ended with its process).
type Flight interface {
	Answered()
	Done()
}

// CalledFlight is a Flight that is told the script whose subrequest or binding call it serves, when
// it serves one: a loop that began in a call is its caller's too.
type CalledFlight interface {
	CalledBy(script string)
}

// WithdrawnFlight is a Flight that can end as though it never began: a binding call handed back
// to be carried whole (a request of its own then), or a request refused before it was sent, was
// neither answered by its worker nor failed. Done after Withdraw does nothing.
type WithdrawnFlight interface {
	Withdraw()
}

// withdraw ends f as a request that never reached its worker, where f can say so (otherwise its
// Done says the rest).
func withdraw(f Flight) {
	if wf, ok := f.(WithdrawnFlight); ok {
		wf.Withdraw()
	}
}

// TunnelFlight is a Flight that is told when, after the switch to another protocol (a
// WebSocket), its client sent the worker something (Input) and the worker sent its client
// something (Output): a message not answered yet may be what the worker is running for.
type TunnelFlight interface {
	Input()
	Output()
}

// WallLimited is a Target whose worker has a wall-time limit of its own per request (its
// limits.cpuMs), below the edge's ResponseTimeout: past it the request ends with a 504.
type WallLimited interface {
	WallLimit() time.Duration
}

// responseTimeout is the time a request to target may take: the edge's, or the worker's own
// limit when that is shorter.
func (h *Handler) responseTimeout(target Target) time.Duration {
	limit := h.limits.ResponseTimeout
	if wl, ok := target.(WallLimited); ok {
		if d := wl.WallLimit(); d > 0 && d < limit {
			limit = d
		}
	}
	return limit
}

// Lookup outcomes.
const (
	Found = iota
	UnknownHost
	NotReady
)

// Resolver maps a normalized hostname to the target serving it.
type Resolver interface {
	Resolve(hostname string) (Target, int)
}

// Handler is the edge.
type Handler struct {
	resolve  Resolver
	limits   Limits
	up       upstreams
	requests *prometheus.CounterVec
	byCode   sync.Map // int → prometheus.Counter: one label lookup per status, not per request
	log      *slog.Logger
	// inProcess and carried count service binding calls by where they ran: in the caller's
	// process, or carried by the edge to another (takoform_runtime_binding_calls_total).
	inProcess, carried prometheus.Counter
	// looping counts, per script, requests from this node's egress in flight (string → *atomic.Int64).
	looping sync.Map
	// orgRequests and orgLatency measure each organization's answers, by status class, and their
	// time (takoform_runtime_edge_organization_*), with one label lookup per organization (orgs).
	orgRequests *prometheus.CounterVec
	orgLatency  *prometheus.HistogramVec
	orgs        sync.Map // organization → *orgMeasures
	// serving answers the load balancers' health check (nil: always serving).
	serving atomic.Pointer[func() (bool, string)]
	// routes says whether the node routes workers at all (nil: it does), and why not: a node
	// retired from its pool, drained, or not yet confirmed after a restart serves nothing.
	routes atomic.Pointer[func() (bool, string)]
}

// SetRoutes sets whether the edge routes workers at all (SPEC 6.2), and why not.
func (h *Handler) SetRoutes(routes func() (bool, string)) { h.routes.Store(&routes) }

// SetHealth sets what GET /healthz answers for the node: whether it serves, and why not.
func (h *Handler) SetHealth(serving func() (bool, string)) { h.serving.Store(&serving) }

// HealthPath is the load balancers' health check (SPEC 6.2), answered only for a request whose
// Host names no worker's hostname (an IP address or localhost: what a load balancer sends), so
// that a worker's own /healthz is never shadowed.
const HealthPath = "/healthz"

func healthHost(host string) bool {
	name := Hostname(host)
	if name == "" || name == "localhost" {
		return true
	}
	_, err := netip.ParseAddr(strings.Trim(name, "[]"))
	return err == nil
}

// health answers the health check: 200 while the node serves, 503 (with why) while it does not.
func (h *Handler) health(w http.ResponseWriter) {
	ok, why := true, ""
	if f := h.serving.Load(); f != nil {
		ok, why = (*f)()
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	body := map[string]string{"status": "serving"}
	if !ok {
		body = map[string]string{"status": "not serving", "reason": why}
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(body)
}

// Owned is a Target that knows its organization, so the edge measures per organization.
type Owned interface {
	Organization() string
}

// orgMeasures are one organization's counters by status class (1xx to 5xx) and its latency.
type orgMeasures struct {
	classes [5]prometheus.Counter
	latency prometheus.Observer
}

func (h *Handler) measures(org string) *orgMeasures {
	if m, ok := h.orgs.Load(org); ok {
		return m.(*orgMeasures)
	}
	m := &orgMeasures{latency: h.orgLatency.WithLabelValues(org)}
	for i := range m.classes {
		m.classes[i] = h.orgRequests.WithLabelValues(org, strconv.Itoa(i+1)+"xx")
	}
	got, _ := h.orgs.LoadOrStore(org, m)
	return got.(*orgMeasures)
}

// measure counts one answer of an organization's worker.
func (h *Handler) measure(org string, code int, took time.Duration) {
	m := h.measures(org)
	if class := code / 100; class >= 1 && class <= 5 {
		m.classes[class-1].Inc()
	}
	m.latency.Observe(took.Seconds())
}

// MaxEgressLoop is how many requests from this node's own egress one script may have in flight; the
// next is answered 508 (SPEC 5.1).
const MaxEgressLoop = 16

// New builds the edge with limits (zero values take the defaults). Requests are counted by status
// in the registerer's takoform_runtime_edge_requests_total. Serve it with NewH1Server.
func New(resolver Resolver, reg prometheus.Registerer, log *slog.Logger, limits Limits) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{resolve: resolver, log: log, limits: limits.WithDefaults()}
	h.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoform_runtime_edge_requests_total",
		Help: "Requests answered by the runtime node's edge, by HTTP status.",
	}, []string{"code"})
	bindingCalls := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoform_runtime_binding_calls_total",
		Help: "Service binding calls by where they ran: in the caller's own process, or carried by the edge to another process of the node.",
	}, []string{"path"})
	h.inProcess, h.carried = bindingCalls.WithLabelValues("process"), bindingCalls.WithLabelValues("node")
	h.orgRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoform_runtime_edge_organization_requests_total",
		Help: "Requests the edge carried to an organization's workers, by organization and status class (2xx … 5xx).",
	}, []string{"organization", "class"})
	h.orgLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "takoform_runtime_edge_organization_request_duration_seconds",
		Help:    "Time from the request's arrival at the edge to the end of the worker's answer, by organization.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"organization"})
	if reg != nil {
		reg.MustRegister(h.requests, bindingCalls, h.orgRequests, h.orgLatency)
	}
	return h
}

// CloseIdle closes the edge's idle connections to workers' sockets.
func (h *Handler) CloseIdle() { h.up.closeIdle() }

func (h *Handler) counter(code int) prometheus.Counter {
	if c, ok := h.byCode.Load(code); ok {
		return c.(prometheus.Counter)
	}
	c, _ := h.byCode.LoadOrStore(code, h.requests.WithLabelValues(strconv.Itoa(code)))
	return c.(prometheus.Counter)
}

// Hostname normalizes a Host header: port removed, lowercase, no trailing dot.
func Hostname(host string) string {
	// Only a host with a colon can carry a port (most carry none, and SplitHostPort's error for
	// them is two allocations a request).
	if strings.IndexByte(host, ':') >= 0 {
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// ServeHTTP routes one client request. One framed both by Content-Length and Transfer-Encoding
// (or by Transfer-Encoding on HTTP/1.0) is refused and its connection closed (RFC 9112 6.1): a
// proxy in front may have read its body otherwise, and what it took for the next request would
// reach a worker.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if refuseFraming(r) {
		h.counter(h.refuse(w, http.StatusBadRequest)).Inc()
		return
	}
	if r.URL.Path == HealthPath && (r.Method == http.MethodGet || r.Method == http.MethodHead) && healthHost(r.Host) {
		h.health(w)
		return
	}
	h.serve(w, r, false)
}

// refuseFraming reports whether r's framing, as the edge's own loop parsed it (Server), makes the
// edge refuse it and close its connection. (HTTP/2 has no such framing: its requests never are.)
func refuseFraming(r *http.Request) bool {
	bad, _ := r.Context().Value(badFramingKey{}).(bool)
	return bad
}

// Serves reports whether a route names this (normalized) hostname: the egress proxy then hands
// the subrequest to ServeEgress.
func (h *Handler) Serves(hostname string) bool {
	_, outcome := h.resolve.Resolve(hostname)
	return outcome != UnknownHost
}

// OwnerOf names the organization whose worker is routed at hostname now, or "".
func (h *Handler) OwnerOf(hostname string) string {
	target, outcome := h.resolve.Resolve(hostname)
	if o, ok := target.(Owned); ok && outcome != UnknownHost {
		return o.Organization()
	}
	return ""
}

// ServeEgress routes one request that a worker of this node sent through its egress.
func (h *Handler) ServeEgress(w http.ResponseWriter, r *http.Request) {
	// A worker's subrequest comes from this node's own loopback: it is never a trusted proxy's.
	h.serve(w, r.WithContext(context.WithValue(r.Context(), fromWorkerKey{}, true)), true)
}

// fromWorkerKey marks a request that a worker sent through the node's egress.
type fromWorkerKey struct{}

// callerKey carries, in a request's context, the script whose egress sent it.
type callerKey struct{}

// WithCaller marks ctx as carrying a subrequest of caller's workers (the egress proxy of one
// incarnation sets it; no header a worker could write takes part).
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// enterLoop counts one request from caller's egress to script, unless MaxEgressLoop are in
// flight already between the two; leave undoes it. The count is per caller, so that one tenant
// holding requests to a script open never makes another tenant's calls to it look like a loop.
func (h *Handler) enterLoop(caller, script string) (leave func(), ok bool) {
	v, _ := h.looping.LoadOrStore(caller+"\x00"+script, new(atomic.Int64))
	n := v.(*atomic.Int64)
	if n.Add(1) > MaxEgressLoop {
		n.Add(-1)
		return nil, false
	}
	return func() { n.Add(-1) }, true
}

// ServeBinding serves one request a worker of this node sent through a service binding: lookup
// finds the callee's serving incarnation (UnknownHost when the binding reaches no worker). It is
// counted like any request from this node's own egress, so a chain of bindings that loops ends
// in 508 like a loop through URLs. With local, the edge only admits the call and hands it to
// local, which runs it in the caller's own process; without, the edge carries it.
func (h *Handler) ServeBinding(w http.ResponseWriter, r *http.Request, caller string, lookup func() (Target, int), local Local) {
	ctx := context.WithValue(WithCaller(r.Context(), caller), fromWorkerKey{}, true)
	if local == nil {
		h.carried.Inc()
	}
	h.serveTo(w, r.WithContext(ctx), true, lookup, problemUnboundService, local)
}

// Local takes a binding call the edge admitted (its loop count and the callee's flight taken),
// to run it in the caller's own process. limit is the time the call may take; end ends the call
// (answered: the callee began its answer) and must be called once however the call ends, also
// after Local returned. Local reports whether the call runs in the caller's process; when it
// does not (the callee lives in another process), it has told the caller to send the call whole,
// which ServeBinding then carries without a Local, and has not called end: the edge withdraws the
// callee's flight (WithdrawnFlight), which was neither answered nor failed.
type Local func(w http.ResponseWriter, target Target, limit time.Duration, end func(answered bool)) (inProcess bool)

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, fromEgress bool) {
	if f := h.routes.Load(); f != nil {
		if ok, why := (*f)(); !ok {
			h.counter(writeProblem(w, adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotServing, "Service Unavailable", why))).Inc()
			return
		}
	}
	host := Hostname(r.Host)
	h.serveTo(w, r, fromEgress, func() (Target, int) { return h.resolve.Resolve(host) }, problemUnknownHost, nil)
}

func (h *Handler) serveTo(w http.ResponseWriter, r *http.Request, fromEgress bool, lookup func() (Target, int), unknown *adminapi.Problem, local Local) {
	code := http.StatusOK
	start := time.Now()
	org := ""
	defer func() {
		if code != 0 {
			h.counter(code).Inc()
			if org != "" {
				h.measure(org, code, time.Since(start))
			}
		}
	}()
	host := Hostname(r.Host)
	// A drain can retire the target between lookup and Acquire; look again, a bounded number of times.
	for range 5 {
		target, outcome := lookup()
		if o, ok := target.(Owned); ok && outcome != UnknownHost {
			org = o.Organization()
		}
		switch outcome {
		case UnknownHost:
			code = writeProblem(w, unknown)
			return
		case NotReady:
			code = writeProblem(w, problemNotReady)
			return
		}
		leave := func() {}
		caller := ""
		if fromEgress {
			var ok bool
			caller, _ = r.Context().Value(callerKey{}).(string)
			if leave, ok = h.enterLoop(caller, target.Script()); !ok {
				h.log.Warn("edge refused a loop", "host", host, "script", target.Script())
				code = writeProblem(w, problemLoop)
				return
			}
		}
		flight, ok := target.Acquire()
		if !ok {
			leave()
			continue
		}
		if c, ok := flight.(CalledFlight); ok && caller != "" {
			c.CalledBy(caller)
		}
		if local != nil {
			// The call is the caller's process's to run now, and its answer the worker's: the edge
			// counts only what it carries.
			code = 0
			var once sync.Once
			end := func(answered bool) {
				once.Do(func() {
					if answered {
						flight.Answered()
					}
					flight.Done()
					leave()
				})
			}
			if local(w, target, h.responseTimeout(target), end) {
				h.inProcess.Inc()
			} else {
				once.Do(func() {
					withdraw(flight)
					flight.Done()
					leave()
				})
			}
			return
		}
		defer leave()
		defer flight.Done()
		code = h.forward(w, r, target, h.responseTimeout(target), flight)
		return
	}
	code = writeProblem(w, problemSwitching)
}

var (
	problemUnknownHost    = adminapi.NewProblem(http.StatusNotFound, adminapi.CodeUnknownHost, "Not Found", "no worker is routed at this host")
	problemUnboundService = adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Service Unavailable",
		"this service binding reaches no worker on this node now (its worker was deleted, or the binding changed)")
	problemNotReady = adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Service Unavailable",
		"the worker routed at this host has no Ready incarnation")
	problemSwitching = adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Service Unavailable",
		"the worker routed at this host is switching incarnations; retry")
	problemLoop = adminapi.NewProblem(http.StatusLoopDetected, adminapi.CodeLoopDetected, "Loop Detected",
		fmt.Sprintf("this worker already has %d requests in flight from workers of this node; it seems to call itself", MaxEgressLoop))
)

// writeProblem answers p and returns its status.
func writeProblem(w http.ResponseWriter, p *adminapi.Problem) int {
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
	return p.Status
}
