// Package egress is the runtime node's outbound path for workers (SPEC 5.1 "Egress"). An org
// process has no network of its own: every fetch() of its isolates reaches the runtime over the
// process's egress socket, stamped by the router with the isolate's identity, and leaves from
// here, or goes to the edge when the hostname is one this node serves.
//
// Policy decides which addresses a subrequest may reach, after name resolution, on every hop (a
// redirect is a new subrequest of the worker): public unicast addresses only, never this node's
// own nor its published edge's, nor the operator's --egress-deny ranges. Meter bounds what one
// worker's subrequests take: a cap in flight, a budget per request it serves, and nothing from
// its ctx.waitUntil work more than WaitUntilAfter after its last response.
package egress

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// Defaults of Meter (SPEC 5.1; Cloudflare's published limits are the reference).
const (
	// DefaultSubrequestLimit caps one worker's subrequests in flight.
	DefaultSubrequestLimit = 50
	// DefaultSubrequestsPerRequest is each request's budget of subrequests (Cloudflare: 50 on
	// Free, 1,000 on paid plans).
	DefaultSubrequestsPerRequest = 1000
	// WaitUntilAfter is how long after a worker's last response its ctx.waitUntil work may still
	// make subrequests (Cloudflare: 30 s).
	WaitUntilAfter = 30 * time.Second
)

// ParseDeny checks --egress-deny values and returns them in canonical CIDR form.
func ParseDeny(values []string) ([]string, error) {
	out := make([]string, 0, len(values))
	for _, v := range values {
		p, err := netip.ParsePrefix(strings.TrimSpace(v))
		if err != nil {
			return nil, fmt.Errorf("--egress-deny %q is not a CIDR (for example 203.0.113.0/24 or 2001:db8::/32)", v)
		}
		out = append(out, p.Masked().String())
	}
	return out, nil
}

// nonPublic are ranges netip's predicates call global unicast although no worker should reach
// them: shared address space (CGNAT), IETF protocol assignments, the documentation ranges, the
// benchmark range (often used for internal services), reserved space, the NAT64 and 6to4 and
// Teredo prefixes (which map any IPv4 address, private ones included, into one that looks
// public), and the discard prefix.
var nonPublic = mustPrefixes(
	"0.0.0.0/8", "100.64.0.0/10", "192.0.0.0/24", "192.0.2.0/24", "198.18.0.0/15", "198.51.100.0/24",
	"203.0.113.0/24", "240.0.0.0/4", "64:ff9b::/96", "64:ff9b:1::/48", "100::/64", "2001::/23",
	"2001:db8::/32", "2002::/16",
)

func mustPrefixes(cidrs ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(cidrs))
	for i, c := range cidrs {
		out[i] = netip.MustParsePrefix(c)
	}
	return out
}

// Policy is which addresses workers' subrequests may reach. It is safe for concurrent use.
type Policy struct {
	published []string
	operator  []netip.Prefix
	deny      atomic.Pointer[[]netip.Prefix]
}

// NewPolicy is the policy of a node whose edge is published at published (host:port listen
// addresses) with the operator's ranges (ParseDeny's form). Refresh reads the node's addresses
// again.
func NewPolicy(published, operator []string) (*Policy, error) {
	p := &Policy{published: published}
	for _, c := range operator {
		pr, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("egress deny %q: %w", c, err)
		}
		p.operator = append(p.operator, pr.Masked())
	}
	return p, p.Refresh()
}

// Refresh reads this node's addresses again (they are denied as /32 or /128).
func (p *Policy) Refresh() error {
	list, err := DenyList(p.published, nil)
	if err != nil {
		return err
	}
	deny := slices.Clone(p.operator)
	for _, c := range list {
		deny = append(deny, netip.MustParsePrefix(c))
	}
	p.deny.Store(&deny)
	return nil
}

// Allowed reports whether a subrequest may reach ip.
func (p *Policy) Allowed(ip netip.Addr) bool {
	ip = ip.Unmap()
	if !ip.IsValid() || !ip.IsGlobalUnicast() || ip.IsPrivate() || ip.IsLoopback() || ip.IsLinkLocalUnicast() ||
		ip.IsMulticast() || ip.IsUnspecified() || ip.IsInterfaceLocalMulticast() {
		return false
	}
	for _, n := range nonPublic {
		if n.Contains(ip) {
			return false
		}
	}
	for _, n := range *p.deny.Load() {
		if n.Contains(ip) {
			return false
		}
	}
	return true
}

// DenyList is every address of this node's interfaces and of its published edge, as /32 or /128
// (an address public ranges admit may well be this node's own, which is how a worker once reached
// its own node), with extra. Sorted, so that the same addresses give the same list.
func DenyList(published []string, extra []string) ([]string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("list this node's addresses for the egress deny list: %w", err)
	}
	var ips []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	for _, pub := range published {
		host := pub
		if h, _, err := net.SplitHostPort(pub); err == nil {
			host = h
		}
		if ip, err := netip.ParseAddr(host); err == nil && !ip.IsUnspecified() {
			ips = append(ips, ip.Unmap())
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
		add(netip.PrefixFrom(ip, ip.BitLen()).String())
	}
	for _, c := range extra {
		add(c)
	}
	slices.Sort(out)
	return out, nil
}

// errRefused is a subrequest to an address the policy does not allow.
var errRefused = errors.New("refused")

// Meter bounds one worker's subrequests: at most Limit in flight, at most PerRequest for each
// request the worker serves (spent while any of its requests is in flight, and for WaitUntilAfter
// after the last one ended: its ctx.waitUntil work), and none after that. It is safe for
// concurrent use.
type Meter struct {
	limit      int64
	perRequest int64
	after      time.Duration
	now        func() time.Time

	inflight atomic.Int64
	refused  atomic.Int64

	mu     sync.Mutex
	active int
	budget int64
	quiet  time.Time // when its last request ended (zero: it never served one)
	// pending are the subrequests in flight, and ended the last maxEnded that ended: a request of
	// the worker's waiting for a subrequest's answer is not holding its process's thread.
	pending map[*Subrequest]struct{}
	ended   []Subrequest
}

// Subrequest is when one subrequest began, when its body had been wholly sent (zero: not yet; its
// worker's code may still be making it), when its answer began to come back to the worker (zero:
// not yet), and when it ended (zero: in flight), each a reading of time.Now, whose monotonic clock
// orders them.
type Subrequest struct {
	Began, Sent, Answered, Ended time.Time
}

// maxEnded is how many ended subrequests a meter remembers.
const maxEnded = 16

// NewMeter is a meter of limit in flight, perRequest per request, and after since the last
// response (each ≤ 0: its default).
func NewMeter(limit, perRequest int, after time.Duration) *Meter {
	if limit <= 0 {
		limit = DefaultSubrequestLimit
	}
	if perRequest <= 0 {
		perRequest = DefaultSubrequestsPerRequest
	}
	if after <= 0 {
		after = WaitUntilAfter
	}
	return &Meter{limit: int64(limit), perRequest: int64(perRequest), after: after, now: time.Now, pending: map[*Subrequest]struct{}{}}
}

// SetClock replaces the meter's clock (tests move it).
func (m *Meter) SetClock(now func() time.Time) { m.now = now }

// Begin counts one request the worker serves, adding its budget; end it when its response is
// complete.
func (m *Meter) Begin() (end func()) {
	m.mu.Lock()
	if m.active == 0 && !m.quiet.IsZero() && m.now().Sub(m.quiet) > m.after {
		m.budget = 0 // what earlier requests left was theirs, and their time is over
	}
	m.active++
	m.budget += m.perRequest
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			if m.active--; m.active == 0 {
				m.quiet = m.now()
			}
			m.mu.Unlock()
		})
	}
}

// InFlight is the number of subrequests in flight; Refused counts those refused.
func (m *Meter) InFlight() int64 { return m.inflight.Load() }

// Refused counts the subrequests the meter refused.
func (m *Meter) Refused() int64 { return m.refused.Load() }

// admit takes one subrequest, or says why not.
func (m *Meter) admit() *adminapi.Problem {
	m.mu.Lock()
	switch {
	case m.active == 0 && (m.quiet.IsZero() || m.now().Sub(m.quiet) > m.after):
		m.mu.Unlock()
		m.refused.Add(1)
		return adminapi.NewProblem(http.StatusTooManyRequests, adminapi.CodeSubrequestLimit, "Too Many Requests",
			fmt.Sprintf("this worker's requests ended more than %s ago: work it left running (ctx.waitUntil) makes no more subrequests", m.after))
	case m.budget <= 0:
		m.mu.Unlock()
		m.refused.Add(1)
		return adminapi.NewProblem(http.StatusTooManyRequests, adminapi.CodeSubrequestLimit, "Too Many Requests",
			fmt.Sprintf("this worker used the %d subrequests each of its requests may make", m.perRequest))
	}
	m.budget--
	m.mu.Unlock()
	if m.inflight.Add(1) > m.limit {
		m.inflight.Add(-1)
		m.refused.Add(1)
		return adminapi.NewProblem(http.StatusTooManyRequests, adminapi.CodeSubrequestLimit, "Too Many Requests",
			fmt.Sprintf("this worker already has %d subrequests in flight, the most a runtime node allows", m.limit))
	}
	return nil
}

// Admitted serves h as one more subrequest of the worker when its meter allows, and refuses it
// (429) otherwise. Its fetch()es and its service binding calls share the one meter.
func (m *Meter) Admitted(w http.ResponseWriter, r *http.Request, h http.Handler) {
	w, r, release, ok := m.Hold(w, r)
	if !ok {
		return
	}
	// Counted until its response has been copied back whole (or the worker went away), which is
	// when h returns.
	defer release()
	h.ServeHTTP(w, r)
}

// Hold takes one subrequest of the worker, r, counted in flight until release is called (once; a
// second call does nothing), or refuses it with a 429 written to w. It is to be read from tr,
// which notes when its body was wholly read, and answered through tw, which notes when its answer
// began.
func (m *Meter) Hold(w http.ResponseWriter, r *http.Request) (tw http.ResponseWriter, tr *http.Request, release func(), ok bool) {
	if p := m.admit(); p != nil {
		w.Header().Set("Retry-After", "1")
		writeProblem(w, p)
		return nil, nil, nil, false
	}
	sub := &Subrequest{Began: time.Now()}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		sub.Sent = sub.Began
	} else {
		sending := *r
		sending.Body = &sentBody{ReadCloser: r.Body, m: m, sub: sub}
		r = &sending
	}
	m.mu.Lock()
	m.pending[sub] = struct{}{}
	m.mu.Unlock()
	var once sync.Once
	return &answerWriter{ResponseWriter: w, m: m, sub: sub}, r, func() {
		once.Do(func() {
			m.mu.Lock()
			delete(m.pending, sub)
			sub.Ended = time.Now()
			m.ended = append(m.ended, *sub)
			if len(m.ended) > maxEnded {
				m.ended = slices.Delete(m.ended, 0, len(m.ended)-maxEnded)
			}
			m.mu.Unlock()
			m.inflight.Add(-1)
		})
	}, true
}

// Subrequests answers the worker's subrequests in flight, and the last ones that ended, in no
// particular order.
func (m *Meter) Subrequests() []Subrequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := slices.Clone(m.ended)
	for sub := range m.pending {
		out = append(out, *sub)
	}
	return out
}

// sentBody notes on its Meter when a subrequest's body has been read whole.
type sentBody struct {
	io.ReadCloser
	m   *Meter
	sub *Subrequest
}

func (b *sentBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.m.mu.Lock()
		if b.sub.Sent.IsZero() {
			b.sub.Sent = time.Now()
		}
		b.m.mu.Unlock()
	}
	return n, err
}

// answerWriter notes when a subrequest's answer began (its final status, not an informational
// one) on its Meter.
type answerWriter struct {
	http.ResponseWriter
	m    *Meter
	sub  *Subrequest
	seen bool
}

func (a *answerWriter) answered() {
	if a.seen {
		return
	}
	a.seen = true
	a.m.mu.Lock()
	a.sub.Answered = time.Now()
	a.m.mu.Unlock()
}

func (a *answerWriter) WriteHeader(code int) {
	if code >= 200 || code == http.StatusSwitchingProtocols {
		a.answered()
	}
	a.ResponseWriter.WriteHeader(code)
}

func (a *answerWriter) Write(b []byte) (int, error) {
	a.answered()
	return a.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the writer beneath (flushes, deadlines).
func (a *answerWriter) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// Flush sends what was written so far (a streamed answer: the edge flushes through it when it
// serves a subrequest to one of this node's workers).
func (a *answerWriter) Flush() {
	a.answered()
	_ = http.NewResponseController(a.ResponseWriter).Flush()
}

// Hijack takes the connection for a protocol switch (the 101 goes on it directly): an answer.
func (a *answerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	a.answered()
	return http.NewResponseController(a.ResponseWriter).Hijack()
}

// Local is this node's edge as the egress sees it.
type Local interface {
	// Serves reports whether the edge routes this (normalized) hostname.
	Serves(hostname string) bool
	// ServeEgress serves a request that came from this node's own egress.
	ServeEgress(w http.ResponseWriter, r *http.Request)
}

// Egress carries workers' subrequests. It is safe for concurrent use.
type Egress struct {
	policy *Policy
	local  Local
	out    *httputil.ReverseProxy
}

// New is the egress of a node with policy, handing subrequests for hostnames local serves to it
// (nil: none).
func New(policy *Policy, local Local) *Egress {
	e := &Egress{policy: policy, local: local}
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	transport := &http.Transport{
		Proxy:                 nil, // never an environment's proxy: the policy is on the address dialled
		DialContext:           e.dial(dialer),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       60 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	e.out = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = &url.URL{Scheme: pr.In.URL.Scheme, Host: pr.In.URL.Host, Path: pr.In.URL.Path, RawPath: pr.In.URL.RawPath, RawQuery: pr.In.URL.RawQuery}
			pr.Out.Host = pr.In.URL.Host
		},
		Transport: transport,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			detail := "the runtime node could not complete this subrequest"
			if errors.Is(err, errRefused) {
				detail = fmt.Sprintf("the runtime node refused this subrequest: %s resolves to no address workers may reach (private, local, reserved, or this node's own)", edge.Hostname(r.URL.Host))
			}
			writeProblem(w, adminapi.NewProblem(http.StatusBadGateway, adminapi.CodeEgressRefused, "Bad Gateway", detail))
		},
	}
	return e
}

// dial connects to the first address of the host that the policy allows, resolved here: a name
// that resolves to a forbidden address reaches nothing.
func (e *Egress) dial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		var ips []netip.Addr
		if ip, err := netip.ParseAddr(host); err == nil {
			ips = []netip.Addr{ip}
		} else if ips, err = net.DefaultResolver.LookupNetIP(ctx, "ip", host); err != nil {
			return nil, err
		}
		var lastErr error = errRefused
		for _, ip := range ips {
			if !e.policy.Allowed(ip) {
				continue
			}
			c, err := d.DialContext(ctx, network, net.JoinHostPort(ip.String(), port))
			if err == nil {
				return c, nil
			}
			lastErr = err
		}
		return nil, lastErr
	}
}

// Serve carries one subrequest of caller's worker, metered by m: to the edge when this node
// serves its hostname, else out to the network under the policy.
func (e *Egress) Serve(w http.ResponseWriter, r *http.Request, m *Meter, caller string) {
	m.Admitted(w, r, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { e.forward(w, r, caller) }))
}

func (e *Egress) forward(w http.ResponseWriter, r *http.Request, caller string) {
	if !r.URL.IsAbs() || (r.URL.Scheme != "http" && r.URL.Scheme != "https") {
		writeProblem(w, adminapi.NewProblem(http.StatusBadRequest, adminapi.CodeEgressRefused, "Bad Request",
			"the runtime node carries only http and https subrequests"))
		return
	}
	if e.local != nil {
		if host := edge.Hostname(r.URL.Host); e.local.Serves(host) {
			// A hostname this node serves never leaves it (its own addresses are denied anyway):
			// the edge serves it, knowing where it came from.
			in := r.Clone(edge.WithCaller(r.Context(), caller))
			in.Host = r.URL.Host
			in.URL = &url.URL{Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery}
			in.RequestURI = in.URL.RequestURI()
			e.local.ServeEgress(w, in)
			return
		}
	}
	e.out.ServeHTTP(w, r)
}

func writeProblem(w http.ResponseWriter, p *adminapi.Problem) {
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
