package edge

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// TLSListener serves HTTPS on l with config: it completes each connection's handshake itself
// (within handshakeTimeout, never holding up the next Accept) and then hands Server the *tls.Conn,
// which serves it by its negotiated protocol: HTTP/2 on net/http's server, HTTP/1.x on the edge's
// own loop. A connection that negotiated another protocol (an ACME tls-alpn-01 validation) is
// closed once its handshake is done, as net/http does. Served by Server, its connections are held
// to the server's caps from their accept, before their handshake (Limits.MaxConns).
func TLSListener(l net.Listener, config *tls.Config, handshakeTimeout time.Duration) net.Listener {
	return &tlsListener{inner: l, config: config, timeout: handshakeTimeout, conns: make(chan net.Conn), done: make(chan struct{})}
}

type tlsListener struct {
	inner   net.Listener
	config  *tls.Config
	timeout time.Duration
	gate    atomic.Pointer[connGate] // set by Server.Serve before the first Accept
	start   sync.Once                // of the accept loop, at the first Accept: none is uncounted
	conns   chan net.Conn
	done    chan struct{} // closed when inner's Accept failed for good; err says why
	err     error
}

// setGate holds the listener's connections to g's caps from their accept.
func (t *tlsListener) setGate(g *connGate) { t.gate.Store(g) }

func (t *tlsListener) Accept() (net.Conn, error) {
	t.start.Do(func() { go t.acceptLoop() })
	select {
	case c := <-t.conns:
		return c, nil
	case <-t.done:
		return nil, t.err
	}
}

func (t *tlsListener) Close() error   { return t.inner.Close() }
func (t *tlsListener) Addr() net.Addr { return t.inner.Addr() }

// acceptLoop accepts until the listener is closed; a passing failure (out of file descriptors) is
// waited out with a growing pause, as net/http does.
func (t *tlsListener) acceptLoop() {
	var pause time.Duration
	for {
		c, err := t.inner.Accept()
		if err != nil {
			var ne net.Error
			if !errors.Is(err, net.ErrClosed) && errors.As(err, &ne) && !ne.Timeout() {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			t.err = err
			close(t.done)
			return
		}
		pause = 0
		if g := t.gate.Load(); g != nil {
			var ok bool
			if c, ok = g.admit(c); !ok {
				continue // closed unread
			}
		}
		go t.handshake(c)
	}
}

// handshake runs c's TLS handshake and hands the connection to Accept.
func (t *tlsListener) handshake(c net.Conn) {
	tc := tls.Server(c, t.config)
	if t.timeout > 0 {
		_ = c.SetDeadline(time.Now().Add(t.timeout))
	}
	if err := tc.Handshake(); err != nil {
		// A client speaking plain HTTP to the TLS port is told so, as Go's TLS server does.
		var re tls.RecordHeaderError
		if errors.As(err, &re) && re.Conn != nil && looksLikeHTTP(re.RecordHeader) {
			_, _ = io.WriteString(re.Conn, "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n")
		}
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	switch tc.ConnectionState().NegotiatedProtocol {
	case "h2", "", "http/1.1", "http/1.0":
	default:
		tc.Close()
		return
	}
	select {
	case t.conns <- tc:
	case <-t.done:
		tc.Close()
	}
}

// looksLikeHTTP reports whether the first five bytes of a would-be TLS record are those of a
// plain HTTP request.
func looksLikeHTTP(b [5]byte) bool {
	switch string(b[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO":
		return true
	}
	return false
}
