package edge

import (
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"strings"
	"time"
)

// Limits bound what one client may take of the edge (SPEC 5.1). Zero values take the defaults.
type Limits struct {
	// IdleTimeout closes a kept-alive connection that sends no next request for this long.
	IdleTimeout time.Duration
	// HeaderTimeout is how long a request's line and headers may take to arrive (slow headers,
	// "slowloris").
	HeaderTimeout time.Duration
	// BodyTimeout is how long a request's whole body may take to arrive once its headers have: a
	// body that trickles in slower is cut (408).
	BodyTimeout time.Duration
	// ResponseTimeout is a request's total time from its headers to the end of the worker's
	// answer: a worker that has not answered by then is answered 504; an answer still streaming
	// is cut off.
	ResponseTimeout time.Duration
	// MaxHeaderBytes bounds the request line and headers together (431 beyond).
	MaxHeaderBytes int
	// MaxBodyBytes bounds a request's body, counted as it streams (413 beyond).
	MaxBodyBytes int64
	// MaxConns bounds the client connections the edge holds at once, over all its listeners (TLS
	// ones from their accept, before their handshake); the server holds it within the process's
	// descriptor limit too (MaxConnsForDescriptors). A connection beyond it is closed unread.
	MaxConns int
	// MaxConnsPerSource bounds those of one source: the peer's IPv4 address, or its IPv6 /64. A
	// peer in TrustedProxies (a load balancer carries many clients) is held to MaxConns only.
	MaxConnsPerSource int
	// TrustedProxies are the peers whose X-Forwarded-*, X-Real-IP and Forwarded headers are
	// believed (a TLS terminator or load balancer in front of the edge); everyone else's are
	// replaced by what the edge sees of the connection.
	TrustedProxies []netip.Prefix
}

// Defaults of Limits, and why:
//   - idle 60s: what common load balancers use (AWS ALB, GCP), below nginx's 75s; a client that
//     wants its connection kept sends its next request in far less.
//   - headers 10s: a real client sends its headers in one round trip; 10s is ample on a bad mobile
//     link and holds a slowloris connection only briefly.
//   - body 30s and response 30s: SPEC 5.1's total request time (Cloudflare's free plan answers
//     within 100s, but workerd runs a script on one thread and liveness ends a stuck one at
//     ~15s, so nothing legitimate needs more on this node).
//   - headers 64 KiB: SPEC 5.1 (Cloudflare accepts 32 KiB of headers; nginx 4x8 KiB lines).
//   - body 100 MiB: SPEC 5.1, Cloudflare's free and pro plans.
//   - 16,384 connections in total: an idle HTTP/1.x connection costs about 20 KiB (its goroutine,
//     buffers, socket), a TLS one twice that, so the edge's connections stay within a few hundred
//     MiB; on a smaller descriptor limit the server holds fewer (MaxConnsForDescriptors), so the
//     node keeps descriptors for its probes and admin API (idle keep-alive connections from one
//     client, 19,900 of them, once took them all and got every tenant's workers killed).
//   - 256 connections per source: a browser opens at most 6 HTTP/1.1 connections to a host (one
//     for HTTP/2), so 256 serves a few dozen users behind one NAT (an office, a carrier-grade NAT)
//     using several of the node's hostnames at once, while one source takes at most 1/64 of the
//     total.
const (
	DefaultIdleTimeout       = 60 * time.Second
	DefaultHeaderTimeout     = 10 * time.Second
	DefaultBodyTimeout       = 30 * time.Second
	DefaultResponseTimeout   = 30 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxBodyBytes      = 100 << 20
	DefaultMaxConns          = 16384
	DefaultMaxConnsPerSource = 256
)

// WithDefaults returns l with every zero value replaced by its default.
func (l Limits) WithDefaults() Limits {
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.HeaderTimeout <= 0 {
		l.HeaderTimeout = DefaultHeaderTimeout
	}
	if l.BodyTimeout <= 0 {
		l.BodyTimeout = DefaultBodyTimeout
	}
	if l.ResponseTimeout <= 0 {
		l.ResponseTimeout = DefaultResponseTimeout
	}
	if l.MaxHeaderBytes <= 0 {
		l.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if l.MaxBodyBytes <= 0 {
		l.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if l.MaxConns <= 0 {
		l.MaxConns = DefaultMaxConns
	}
	if l.MaxConnsPerSource <= 0 {
		l.MaxConnsPerSource = DefaultMaxConnsPerSource
	}
	return l
}

// ParseTrustedProxies reads --trusted-proxy values: CIDRs or single addresses.
func ParseTrustedProxies(values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p.Masked())
				continue
			}
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q is neither a CIDR nor an address", s)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
		}
	}
	return out, nil
}

// headerSlack is what net/http adds to MaxHeaderBytes before it refuses (its bufio slop): the
// server is given the limit minus this, so that MaxHeaderBytes is what a client can send.
const headerSlack = 4096

// newH2Server builds the net/http server of the edge's HTTP/2 connections (over TLS; Server hands
// it those TLSListener negotiated "h2" on) with l's timeouts and header limit. It serves HTTP/2
// only: HTTP/1.x is the edge's own loop's. It refuses CONNECT (connect.go).
func newH2Server(handler http.Handler, l Limits, errorLog *log.Logger) *http.Server {
	l = l.WithDefaults()
	maxHeader := l.MaxHeaderBytes - headerSlack
	if maxHeader < 1 {
		maxHeader = 1
	}
	protocols := new(http.Protocols)
	protocols.SetHTTP2(true)
	return &http.Server{
		Handler:           noConnect(handler),
		Protocols:         protocols,
		ReadHeaderTimeout: l.HeaderTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    maxHeader,
		// "OPTIONS *" reaches the handler like every request (it answers 404: no host routes "*").
		DisableGeneralOptionsHandler: true,
		ErrorLog:                     errorLog,
	}
}
