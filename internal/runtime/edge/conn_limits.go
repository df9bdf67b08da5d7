package edge

import (
	"errors"
	"io"
	"log"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// connGate holds the edge's client connections to Limits.MaxConns in total and
// Limits.MaxConnsPerSource per source (SPEC 5.1, STYLE 18): idle keep-alive connections from one
// client once took every descriptor of the node, after which its own liveness probes of workers
// failed and every tenant's workers were killed. A connection is counted from its accept (a TLS
// one before its handshake) until it is closed, whoever closes it: the HTTP/1.x loop, net/http's
// HTTP/2 server, a handler that hijacked it. One over a cap is closed at once, unread and
// uncounted.
type connGate struct {
	total, perSource int
	// exempt reports the peers held to the total cap only: trusted proxies, which carry many
	// clients on their connections.
	exempt func(netip.Addr) bool
	logf   func(format string, args ...any)

	mu       sync.Mutex
	open     int
	bySource map[netip.Prefix]int

	refused   atomic.Uint64
	lastNoted atomic.Int64 // unix nanoseconds of the last refusal logged
}

func newConnGate(total, perSource int, exempt func(netip.Addr) bool, logf func(string, ...any)) *connGate {
	return &connGate{total: total, perSource: perSource, exempt: exempt, logf: logf, bySource: map[netip.Prefix]int{}}
}

// sourceOf is what a connection is counted under: its peer's IPv4 address, or the /64 of its IPv6
// one (a single subscriber is given a whole /64, so a per-address cap would hold it to nothing).
// A peer that is not an IP address (a Unix socket) counts under the zero prefix.
func sourceOf(a netip.Addr) netip.Prefix {
	a = a.Unmap()
	switch {
	case a.Is4():
		return netip.PrefixFrom(a, 32)
	case a.Is6():
		p, _ := a.Prefix(64)
		return p
	}
	return netip.Prefix{}
}

// peerAddr is a connection's peer IP address, or the zero Addr.
func peerAddr(c net.Conn) netip.Addr {
	if ta, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		a, _ := netip.AddrFromSlice(ta.IP)
		return a.Unmap()
	}
	return netip.Addr{}
}

// admit counts c, or closes it when a cap is reached. The connection returned releases its count
// when it is closed (once).
func (g *connGate) admit(c net.Conn) (net.Conn, bool) {
	peer := peerAddr(c)
	src := sourceOf(peer)
	perSource := !(peer.IsValid() && g.exempt != nil && g.exempt(peer))
	g.mu.Lock()
	if g.open >= g.total || (perSource && g.bySource[src] >= g.perSource) {
		g.mu.Unlock()
		g.noteRefusal()
		c.Close()
		return nil, false
	}
	g.open++
	g.bySource[src]++
	g.mu.Unlock()
	return &countedConn{Conn: c, gate: g, src: src}, true
}

func (g *connGate) release(src netip.Prefix) {
	g.mu.Lock()
	g.open--
	if n := g.bySource[src] - 1; n > 0 {
		g.bySource[src] = n
	} else {
		delete(g.bySource, src)
	}
	g.mu.Unlock()
}

// refusalNoteEvery is how often, at most, refusals are logged: a flood of them is one line a
// minute, never one per connection.
const refusalNoteEvery = time.Minute

func (g *connGate) noteRefusal() {
	n := g.refused.Add(1)
	now := time.Now().UnixNano()
	last := g.lastNoted.Load()
	if g.logf == nil || now-last < int64(refusalNoteEvery) || !g.lastNoted.CompareAndSwap(last, now) {
		return
	}
	g.logf("edge: closing client connections over its caps (%d in total, %d per source); %d refused since start", g.total, g.perSource, n)
}

// countedConn is an admitted connection: closing it releases its count.
type countedConn struct {
	net.Conn
	gate *connGate
	src  netip.Prefix
	once sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.gate.release(c.src) })
	return err
}

// CloseWrite shuts the sending side of a TCP connection (the HTTP/1.x loop lingers with it after
// a refusal).
func (c *countedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return errors.ErrUnsupported
}

// ReadFrom keeps the TCP connection's own (splice for a tunnel's copy).
func (c *countedConn) ReadFrom(r io.Reader) (int64, error) { return io.Copy(c.Conn, r) }

// gatedListener admits its connections through a gate; those over a cap never leave Accept.
type gatedListener struct {
	net.Listener
	gate *connGate
}

func (l *gatedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if c, ok := l.gate.admit(c); ok {
			return c, nil
		}
	}
}

// LimitListener returns l with its connections held to the server's caps, counted together with
// the server's own: for a listener served by another server beside the edge (the plain-HTTP
// redirect listener), so that it too cannot take the node's descriptors.
func (s *Server) LimitListener(l net.Listener) net.Listener {
	if gl, ok := l.(*gatedListener); ok && gl.gate == s.gate {
		return l
	}
	return &gatedListener{Listener: l, gate: s.gate}
}

// gateListener puts l's connections through the server's caps as Serve accepts them: a
// TLSListener counts them from their accept, before their handshake; any other listener as the
// loop takes them.
func (s *Server) gateListener(l net.Listener) net.Listener {
	switch l := l.(type) {
	case *tlsListener:
		if gl, ok := l.inner.(*gatedListener); !ok || gl.gate != s.gate {
			l.setGate(s.gate)
		}
		return l
	default:
		return s.LimitListener(l)
	}
}

// Refused is how many client connections the server closed at once for being over a cap.
func (s *Server) Refused() uint64 { return s.gate.refused.Load() }

// Conns is how many client connections the server holds now (all listeners it serves or limits,
// TLS ones still in their handshake included).
func (s *Server) Conns() int {
	s.gate.mu.Lock()
	defer s.gate.mu.Unlock()
	return s.gate.open
}

// ConnCaps are the caps the server holds client connections to: in total (Limits.MaxConns, within
// what the process's descriptor limit allows, see MaxConnsForDescriptors) and per source.
func (s *Server) ConnCaps() (total, perSource int) { return s.gate.total, s.gate.perSource }

// newServerGate builds the gate of a server with limits l (defaults applied), its total cap held
// within the process's descriptor limit as it is now.
func newServerGate(l Limits, trusted func(netip.Addr) bool, errorLog *log.Logger) *connGate {
	total := l.MaxConns
	if soft, _, err := descriptorLimit(); err == nil {
		total = min(total, MaxConnsForDescriptors(soft))
	}
	logf := log.Printf
	if errorLog != nil {
		logf = errorLog.Printf
	}
	return newConnGate(total, l.MaxConnsPerSource, trusted, logf)
}
