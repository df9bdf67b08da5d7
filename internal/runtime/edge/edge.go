// Package edge is the runtime node's public face: a standard-library reverse proxy that routes each
// request by its Host header to the Ready incarnation of the route's script (SPEC 5). Any other host
// gets a 404 problem; a route whose script has no Ready incarnation gets a 503 problem.
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
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// Target is one incarnation's socket. Acquire counts a request in flight and fails once the target
// is retired (draining), so the edge looks the route up again and reaches its successor.
type Target interface {
	Addr() string
	Script() string
	Acquire() bool
	Release()
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
	proxy    *httputil.ReverseProxy
	requests *prometheus.CounterVec
	byCode   sync.Map // int → prometheus.Counter: one label lookup per status, not per request
	log      *slog.Logger
	// looping counts, per script, requests from this node's egress in flight (string → *atomic.Int64).
	looping sync.Map
}

// MaxEgressLoop is how many requests from this node's own egress one script may have in flight; the
// next is answered 508 (SPEC 5.1).
const MaxEgressLoop = 16

type targetKey struct{}

// New builds the edge. Requests are counted by status in the registerer's
// takoform_runtime_edge_requests_total.
func New(resolver Resolver, reg prometheus.Registerer, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	h := &Handler{resolve: resolver, log: log}
	h.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "takoform_runtime_edge_requests_total",
		Help: "Requests answered by the runtime node's edge, by HTTP status.",
	}, []string{"code"})
	if reg != nil {
		reg.MustRegister(h.requests)
	}
	transport := &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
		// The upstream is workerd on loopback: never through a proxy from the environment.
		Proxy: nil,
	}
	h.proxy = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			addr := pr.In.Context().Value(targetKey{}).(string)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = addr
			// The worker sees the public hostname it is served at, not the loopback socket.
			pr.Out.Host = pr.In.Host
			pr.SetXForwarded()
			// Never replay a request on a fresh connection when its first one broke: a request that
			// made the worker's process die (or be killed for looping) would run again in the
			// restarted process and take it down too. Go's transport replays a body-less GET on a
			// reused connection; a body it cannot rewind turns that off, and an empty one is still
			// sent without a body.
			switch pr.Out.Method {
			case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
				if pr.Out.Body == nil {
					pr.Out.Body = noReplay{}
				}
			}
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			h.log.Warn("edge upstream error", "host", r.Host, "error", err)
			writeProblem(w, adminapi.NewProblem(http.StatusBadGateway, adminapi.CodeUpstreamError, "Bad Gateway",
				"the worker's runtime did not answer"))
		},
	}
	return h
}

func (h *Handler) counter(code int) prometheus.Counter {
	if c, ok := h.byCode.Load(code); ok {
		return c.(prometheus.Counter)
	}
	c, _ := h.byCode.LoadOrStore(code, h.requests.WithLabelValues(strconv.Itoa(code)))
	return c.(prometheus.Counter)
}

// Hostname normalizes a Host header: port removed, lowercase, no trailing dot.
func Hostname(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// ServeHTTP routes one request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.serve(w, r, false) }

// Serves reports whether a route names this (normalized) hostname: the egress proxy then hands
// the subrequest to ServeEgress.
func (h *Handler) Serves(hostname string) bool {
	_, outcome := h.resolve.Resolve(hostname)
	return outcome != UnknownHost
}

// ServeEgress routes one request that a worker of this node sent through its egress.
func (h *Handler) ServeEgress(w http.ResponseWriter, r *http.Request) { h.serve(w, r, true) }

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

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, fromEgress bool) {
	sw := &statusWriter{ResponseWriter: w}
	defer func() { h.counter(sw.code()).Inc() }()
	host := Hostname(r.Host)
	// A drain can retire the target between lookup and Acquire; look again, a bounded number of times.
	for range 5 {
		target, outcome := h.resolve.Resolve(host)
		switch outcome {
		case UnknownHost:
			writeProblem(sw, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeUnknownHost, "Not Found", "no worker is routed at this host"))
			return
		case NotReady:
			writeProblem(sw, adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Service Unavailable", "the worker routed at this host has no Ready incarnation"))
			return
		}
		leave := func() {}
		if fromEgress {
			var ok bool
			caller, _ := r.Context().Value(callerKey{}).(string)
			if leave, ok = h.enterLoop(caller, target.Script()); !ok {
				h.log.Warn("edge refused a loop", "host", host, "script", target.Script())
				writeProblem(sw, adminapi.NewProblem(http.StatusLoopDetected, adminapi.CodeLoopDetected, "Loop Detected",
					fmt.Sprintf("this worker already has %d requests in flight from workers of this node; it seems to call itself", MaxEgressLoop)))
				return
			}
		}
		if !target.Acquire() {
			leave()
			continue
		}
		defer leave()
		defer target.Release()
		ctx := r.Context()
		h.proxy.ServeHTTP(sw, r.WithContext(contextWithTarget(ctx, target.Addr())))
		return
	}
	writeProblem(sw, adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Service Unavailable", "the worker routed at this host is switching incarnations; retry"))
}

// noReplay is an empty request body that http.Transport cannot rewind, so it never replays the request.
type noReplay struct{}

func (noReplay) Read([]byte) (int, error) { return 0, io.EOF }
func (noReplay) Close() error             { return nil }

func writeProblem(w http.ResponseWriter, p *adminapi.Problem) {
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController (which the reverse proxy uses to flush) reach the original.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

func contextWithTarget(ctx context.Context, addr string) context.Context {
	return context.WithValue(ctx, targetKey{}, addr)
}
