package edge

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Server serves the edge's HTTP/1.x connections with a loop of its own (plain, and over TLS from
// TLSListener) and hands HTTP/2 connections (TLS ones that negotiated "h2") to net/http's server,
// which serves HTTP/2 only. One goroutine per connection reads a request with the edge's strict
// parser (h1parse.go), runs the handler, writes its answer, then reads the next. Like net/http's
// server, it keeps one read pending on the connection while the handler waits for the worker, but
// only between the request read whole and the start of its answer (connReader): a client that
// leaves then cancels the request's context, which ends the worker's request.
type Server struct {
	handler http.Handler
	limits  Limits
	h2      *http.Server // HTTP/2 over TLS
	h2conns *connQueue
	gate    *connGate // client connections' caps, every listener's together

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*h1conn]struct{}
	closing   atomic.Bool
	// accepting counts the Serve loops still running: a shutdown waits for them, so that a
	// connection one accepted as the listener closed is registered, and served, before the
	// shutdown counts what is left.
	accepting sync.WaitGroup
	h2once    sync.Once
	h2err     error       // why the HTTP/2 server stopped on its own (under mu)
	errorLog  *log.Logger // nil: the log package's standard logger
}

// NewH1Server builds the edge's server for handler with l's limits. Call SetTLSConfig before Serve
// when the listener is a TLSListener (its HTTP/2 connections need it).
func NewH1Server(handler http.Handler, l Limits, errorLog *log.Logger) *Server {
	s := &Server{handler: handler, limits: l.WithDefaults(), listeners: map[net.Listener]struct{}{}, conns: map[*h1conn]struct{}{},
		errorLog: errorLog}
	s.gate = newServerGate(s.limits, func(a netip.Addr) bool { return inPrefixes(s.limits.TrustedProxies, a) }, errorLog)
	s.h2 = newH2Server(handler, l, errorLog)
	s.h2conns = &connQueue{conns: make(chan net.Conn), done: make(chan struct{})}
	return s
}

// SetTLSConfig sets the configuration HTTP/2 connections are served with: a copy of c, which
// net/http's server adjusts for HTTP/2 (c stays the TLSListener's, untouched while it serves).
// Serve then starts the HTTP/2 server at once.
func (s *Server) SetTLSConfig(c *tls.Config) { s.h2.TLSConfig = c.Clone() }

// startH2 starts net/http's server of the HTTP/2 connections, once. Should it stop on its own (its
// HTTP/2 setup refused the TLS configuration), the listener is closed and Serve returns why.
func (s *Server) startH2(l net.Listener) {
	s.h2once.Do(func() {
		s.h2conns.addr = l.Addr()
		go func() {
			err := s.h2.Serve(s.h2conns)
			if s.closing.Load() || errors.Is(err, http.ErrServerClosed) {
				return
			}
			s.mu.Lock()
			s.h2err = err
			s.mu.Unlock()
			l.Close()
		}()
	})
}

// Serve accepts connections on l until it is closed or the server shuts down. l may be a plain
// listener, or a TLSListener (whose connections are *tls.Conn, their handshake done). Its
// connections are held to the server's caps (Limits.MaxConns, MaxConnsPerSource).
func (s *Server) Serve(l net.Listener) error {
	l = s.gateListener(l)
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		l.Close()
		return http.ErrServerClosed
	}
	s.listeners[l] = struct{}{}
	s.accepting.Add(1)
	s.mu.Unlock()
	defer s.accepting.Done()
	if s.h2.TLSConfig != nil {
		s.startH2(l) // now, so that a configuration it refuses is known at once
	}
	var pause time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			s.mu.Lock()
			h2err := s.h2err
			s.mu.Unlock()
			if h2err != nil {
				return fmt.Errorf("edge: the HTTP/2 server stopped: %w", h2err)
			}
			var ne net.Error
			if !errors.Is(err, net.ErrClosed) && errors.As(err, &ne) && !ne.Timeout() {
				pause = min(max(2*pause, 5*time.Millisecond), time.Second)
				time.Sleep(pause)
				continue
			}
			return err
		}
		pause = 0
		hc := &h1conn{s: s, raw: c}
		if tc, ok := c.(*tls.Conn); ok {
			state := tc.ConnectionState()
			if state.NegotiatedProtocol == "h2" { // net/http's
				s.startH2(l)
				select {
				case s.h2conns.conns <- tc:
				case <-s.h2conns.done:
					tc.Close()
				}
				continue
			}
			hc.tls = &state
		}
		hc.ctx, hc.cancel = context.WithCancelCause(context.WithValue(context.Background(), http.LocalAddrContextKey, hc.raw.LocalAddr()))
		hc.cr = &connReader{c: hc}
		hc.cr.cond = sync.NewCond(&hc.cr.mu)
		// Served even when a shutdown began meanwhile: the client connected before the listener
		// closed and is owed an answer to its first request (on an inherited listener, the next
		// process takes the connections this one did not accept).
		s.mu.Lock()
		s.conns[hc] = struct{}{}
		s.mu.Unlock()
		go hc.serve()
	}
}

// Shutdown stops accepting, closes idle connections, and waits until the others have finished
// their request or ctx ends, as http.Server.Shutdown does.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closing.Store(true)
	s.mu.Lock()
	for l := range s.listeners {
		l.Close()
	}
	s.mu.Unlock()
	accepted := make(chan struct{})
	go func() { s.accepting.Wait(); close(accepted) }()
	select {
	case <-accepted:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.h2conns.close()
	h2err := make(chan error, 1)
	go func() { h2err <- s.h2.Shutdown(ctx) }()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		s.mu.Lock()
		for c := range s.conns {
			if c.idle.Load() {
				c.raw.Close()
			}
		}
		left := len(s.conns)
		s.mu.Unlock()
		if left == 0 {
			return <-h2err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Close closes every listener and connection now.
func (s *Server) Close() error {
	s.closing.Store(true)
	s.mu.Lock()
	for l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.cancel(http.ErrServerClosed)
		c.raw.Close()
	}
	s.mu.Unlock()
	s.h2conns.close()
	return s.h2.Close()
}

// connQueue is the listener net/http's server takes HTTP/2 connections from.
type connQueue struct {
	addr  net.Addr // the edge's listener's
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.conns:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) close()         { q.once.Do(func() { close(q.done) }) }
func (q *connQueue) Close() error   { q.close(); return nil }
func (q *connQueue) Addr() net.Addr { return q.addr }

// h1conn is one client connection. Its context, every request's, is cancelled when a read or a
// write on the connection fails (the client left, or stopped reading), when the connection ends,
// and when the server is closed.
type h1conn struct {
	s      *Server
	raw    net.Conn
	tls    *tls.ConnectionState
	ctx    context.Context
	cancel context.CancelCauseFunc
	cr     *connReader // what br reads from
	idle   atomic.Bool // waiting for a request to start
	br     *bufio.Reader
	bw     *bufio.Writer
	lr     lineReader
	// small holds back a small answer without a Content-Length (h1writer).
	small []byte
}

// lingerAfterClose is how long a connection closed after a refusal waits, its sending side shut,
// before it is closed whole: a client still sending then reads the refusal rather than a reset
// (net/http waits as long).
const lingerAfterClose = 500 * time.Millisecond

// maxDiscard is how much of a body the handler left unread is read past to keep the connection
// (as net/http does).
const maxDiscard = 256 << 10

// maxKeptLine is the largest buffer for lines longer than the reader's that a connection keeps
// between requests.
const maxKeptLine = 4 << 10

// badFramingKey marks, in a request's context, a request the handler refuses for its framing.
type badFramingKey struct{}

var (
	badFramingCtx = context.WithValue(context.Background(), badFramingKey{}, true)
)

func (c *h1conn) serve() {
	s := c.s
	hijacked := false
	defer func() {
		c.cr.mu.Lock()
		c.cr.disarmLocked()
		c.cr.mu.Unlock()
		c.cancel(net.ErrClosed)
		if !hijacked {
			c.raw.Close()
		}
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	c.br = bufio.NewReaderSize(c.cr, 4<<10)
	c.bw = bufio.NewWriterSize(connWriter{c}, 4<<10)
	ctx := c.ctx
	remote := c.raw.RemoteAddr().String()
	lastPost := false
	for first := true; ; first = false {
		// Waiting for a request: a shutdown closes the connection now, unless it has had none
		// yet (its client connected to be answered, and cannot tell whether a request it sent
		// was read: as net/http does for new connections). The first request's wait is bounded
		// by the header time limit, the next ones' by the idle limit.
		if !first {
			c.idle.Store(true)
			if s.closing.Load() {
				return
			}
		}
		wait := s.limits.IdleTimeout
		if first {
			wait = s.limits.HeaderTimeout
		}
		_ = c.raw.SetReadDeadline(time.Now().Add(wait))
		if _, err := c.br.Peek(1); err != nil {
			return
		}
		c.idle.Store(false)
		if lastPost {
			// RFC 9112 2.2: a CRLF after a POST's body, sent by old clients, is skipped (as
			// net/http does).
			peek, _ := c.br.Peek(min(4, c.br.Buffered()))
			n := 0
			for n < len(peek) && (peek[n] == '\r' || peek[n] == '\n') {
				n++
			}
			_, _ = c.br.Discard(n)
		}
		start := time.Now()
		if !first {
			_ = c.raw.SetReadDeadline(start.Add(s.limits.HeaderTimeout))
		}
		h, perr := readHead(c.br, s.limits.MaxHeaderBytes, &c.lr)
		if cap(c.lr.long) > maxKeptLine {
			c.lr.long = nil // a long line's buffer is not held for the connection's life
		}
		var req *http.Request
		if perr == nil {
			req, perr = h.request()
		}
		if perr != nil {
			if perr.status != 0 {
				c.refuse(perr.status, perr.why)
			}
			return
		}
		lastPost = h.method == http.MethodPost
		_ = c.raw.SetReadDeadline(time.Time{})
		// An answer that cannot be written for this long is cut (a client that does not read).
		_ = c.raw.SetWriteDeadline(start.Add(s.limits.ResponseTimeout + s.limits.HeaderTimeout))
		req.RemoteAddr, req.TLS = remote, c.tls
		w := &h1writer{c: c, req: req, header: make(http.Header, 8)}
		if req.Method == http.MethodConnect {
			// Refused unread (connect.go), and the connection closed: what follows is a tunnel's.
			req.Close = true
			refuseConnect(w, s.handler)
			if w.finish() == nil {
				c.closeWrite()
			}
			return
		}
		rctx := ctx
		if h.badFraming {
			rctx = badFramingCtx
			req.Body = http.NoBody
		} else {
			var body io.Reader
			switch {
			case h.chunked:
				body = &chunkedBody{br: c.br, budget: s.limits.MaxHeaderBytes}
			case h.length > 0:
				body = &lengthBody{br: c.br, left: h.length}
			}
			if body != nil {
				w.body = &h1body{r: body, w: w}
				req.Body = w.body
			} else {
				req.Body = http.NoBody
			}
			if e := req.Header["Expect"]; len(e) > 0 {
				switch {
				case listed(e[:1], "100-continue"): // the first field decides, as in net/http
					// A client of HTTP/1.0 cannot be told to continue: it sends its body anyway.
					if w.body != nil && req.ProtoMinor >= 1 {
						w.body.expect = true
					}
				case e[0] != "":
					c.refuse(http.StatusExpectationFailed, "unsupported Expect")
					return
				}
			}
		}
		req = req.WithContext(rctx)
		if w.body == nil {
			// The request is whole: a client that leaves while the worker works is noticed.
			c.cr.startBackgroundRead()
		}
		aborted := c.run(w, req)
		if w.hijacked {
			hijacked = true
			return
		}
		if aborted {
			return
		}
		if err := w.finish(); err != nil {
			return
		}
		if w.close {
			if h.badFraming || (w.body != nil && !w.body.eof) {
				c.closeWrite() // the client may still be sending: let it read the answer first
			}
			return
		}
		// What is left of the body is read before the next request: a little is, more closes
		// the connection.
		if w.body != nil && !w.body.eof {
			if w.body.expect && !w.body.continued {
				return // the client may or may not send it: the stream cannot be followed
			}
			// The answer is out: a shutdown closes the connection now, as an idle one, rather
			// than wait up to BodyTimeout for the rest of the body.
			c.idle.Store(true)
			if s.closing.Load() {
				return
			}
			_ = c.raw.SetReadDeadline(time.Now().Add(s.limits.BodyTimeout))
			if n, err := io.CopyN(io.Discard, w.body.r, maxDiscard+1); n > maxDiscard || (err != nil && err != io.EOF) {
				return
			}
		}
	}
}

// run calls the handler; a panic ends the connection without finishing the answer. One other
// than http.ErrAbortHandler (with which forward cuts an answer short) is a bug: it is logged with
// its stack, as net/http logs it.
func (c *h1conn) run(w *h1writer, req *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			aborted = true
			if v != http.ErrAbortHandler {
				c.s.logf("edge: panic serving %s: %v\n%s", req.RemoteAddr, v, debug.Stack())
			}
		}
	}()
	c.s.handler.ServeHTTP(w, req)
	return false
}

// logf writes to the server's error log.
func (s *Server) logf(format string, args ...any) {
	if s.errorLog != nil {
		s.errorLog.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// refuse answers a request the loop does not hand the edge (as net/http's server answers one it
// cannot read) and closes the connection.
func (c *h1conn) refuse(status int, why string) {
	text := strconv.Itoa(status) + " " + http.StatusText(status)
	body := text + ": " + why
	_ = c.raw.SetWriteDeadline(time.Now().Add(time.Second))
	c.bw.WriteString("HTTP/1.1 " + text + "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	if c.bw.Flush() == nil {
		c.closeWrite()
	}
}

// closeWrite shuts the sending side and waits a little before the connection is closed whole.
func (c *h1conn) closeWrite() {
	if cw, ok := c.raw.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		time.Sleep(lingerAfterClose)
	}
}

// h1body is a request's body as the handler reads it: it sends 100 Continue before the first read
// when the client asked for it, and notes when it has been read whole.
type h1body struct {
	r         io.Reader
	w         *h1writer
	expect    bool
	continued bool
	eof       bool
}

func (b *h1body) Read(p []byte) (int, error) {
	if b.expect && !b.continued {
		b.continued = true
		// The handler may read the body on another goroutine (forward does) while it writes its
		// answer: 100 Continue goes out only before the answer's head, never into it.
		w := b.w
		w.mu.Lock()
		var err error
		if !w.headSent {
			w.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			err = w.c.bw.Flush()
		}
		w.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	n, err := b.r.Read(p)
	if err == io.EOF && !b.eof {
		b.eof = true
		b.w.mu.Lock()
		if !b.w.headSent {
			// The body is whole and the answer not begun: a client that leaves while the
			// worker works is noticed.
			b.w.c.cr.startBackgroundRead()
		}
		b.w.mu.Unlock()
	}
	return n, err
}

func (b *h1body) Close() error { return nil }

// h1writer is the http.ResponseWriter of one request: the answer goes out by its Content-Length,
// chunked (HTTP/1.1), or delimited by the connection's close (HTTP/1.0). An answer without a
// Content-Length that is small and whole when the handler returns is sent with one (as net/http
// does), so that an HTTP/1.0 connection stays open after it.
type h1writer struct {
	mu          sync.Mutex // orders headSent with a 100 Continue (h1body)
	c           *h1conn
	req         *http.Request
	body        *h1body
	header      http.Header
	status      int
	wroteHeader bool // WriteHeader was called
	headSent    bool // the head is in the connection's buffer
	chunked     bool
	noBody      bool
	length      int64 // the declared Content-Length, or -1
	written     int64
	close       bool
	hijacked    bool
	err         error
}

// smallAnswer is the most of an answer without a Content-Length held back to send it with one.
const smallAnswer = 2048

func (w *h1writer) Header() http.Header { return w.header }

func (w *h1writer) WriteHeader(code int) {
	if w.wroteHeader || w.hijacked {
		return
	}
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 {
		return // informational answers are not passed on
	}
	w.wroteHeader, w.status = true, code
	h := w.header
	w.length = -1
	if v := h["Content-Length"]; len(v) > 0 {
		if n, ok := parseLength(v[0]); ok && len(v) == 1 {
			w.length = n
		} else {
			delete(h, "Content-Length")
		}
	}
	w.noBody = w.req.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified
	if code == http.StatusNoContent {
		delete(h, "Content-Length")
	}
	w.c.small = w.c.small[:0]
}

// sendHead writes the head; whole says the answer is complete in c.small (its length is known).
func (w *h1writer) sendHead(whole bool) {
	w.mu.Lock() // after a 100 Continue being written, if one is
	w.headSent = true
	w.mu.Unlock()
	w.c.cr.abortPendingRead()
	h := w.header
	if whole && w.length < 0 && !w.noBody {
		w.length = int64(len(w.c.small))
		h["Content-Length"] = []string{strconv.Itoa(len(w.c.small))}
	}
	delete(h, "Transfer-Encoding")
	if w.req.Close || w.c.s.closing.Load() || listed(h["Connection"], "close") {
		w.close = true
	}
	if !w.noBody && w.length < 0 {
		if w.req.ProtoMinor >= 1 {
			w.chunked = true
		} else {
			w.close = true
		}
	}
	delete(h, "Connection")
	bw := w.c.bw
	bw.WriteString("HTTP/1.1 ")
	bw.WriteString(strconv.Itoa(w.status))
	bw.WriteByte(' ')
	if text := http.StatusText(w.status); text != "" {
		bw.WriteString(text)
	} else {
		bw.WriteString("status code ")
		bw.WriteString(strconv.Itoa(w.status))
	}
	bw.WriteString("\r\n")
	for k, vv := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) || (k == "Trailer" && !w.chunked) {
			continue
		}
		for _, v := range vv {
			writeField(bw, k, headerValue(v))
		}
	}
	if _, ok := h["Date"]; !ok {
		bw.WriteString("Date: ")
		bw.Write(appendDate(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	if w.chunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	switch {
	case w.close:
		bw.WriteString("Connection: close\r\n")
	case w.req.ProtoMinor == 0:
		bw.WriteString("Connection: keep-alive\r\n")
	}
	bw.WriteString("\r\n")
	if len(w.c.small) > 0 {
		small := w.c.small
		w.c.small = w.c.small[:0]
		w.out(small)
	}
}

// appendDate appends the current time as an HTTP date.
func appendDate(b []byte) []byte {
	return time.Now().UTC().AppendFormat(b, http.TimeFormat)
}

// headerValue keeps a field value on one line (no worker's value starts another field).
func headerValue(v string) string {
	if strings.ContainsAny(v, "\r\n") {
		return strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	return v
}

func (w *h1writer) Write(p []byte) (int, error) {
	if w.hijacked {
		return 0, http.ErrHijacked
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody || len(p) == 0 {
		return len(p), nil
	}
	if w.length >= 0 && w.written+int64(len(p)) > w.length {
		return 0, http.ErrContentLength
	}
	w.written += int64(len(p))
	if !w.headSent {
		if w.length < 0 && len(w.c.small)+len(p) <= smallAnswer {
			w.c.small = append(w.c.small, p...)
			return len(p), nil
		}
		w.sendHead(false)
	}
	w.out(p)
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// out writes body bytes in the answer's framing.
func (w *h1writer) out(p []byte) {
	bw := w.c.bw
	if w.chunked {
		bw.WriteString(strconv.FormatInt(int64(len(p)), 16))
		bw.WriteString("\r\n")
		bw.Write(p)
		_, w.err = bw.WriteString("\r\n")
	} else {
		_, w.err = bw.Write(p)
	}
}

// Flush sends what is buffered (a streamed answer streams on).
func (w *h1writer) Flush() {
	if w.hijacked {
		return
	}
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headSent {
		w.sendHead(false)
	}
	if w.err == nil {
		w.err = w.c.bw.Flush()
	}
}

// SetReadDeadline and SetWriteDeadline serve http.ResponseController.
func (w *h1writer) SetReadDeadline(t time.Time) error  { return w.c.raw.SetReadDeadline(t) }
func (w *h1writer) SetWriteDeadline(t time.Time) error { return w.c.raw.SetWriteDeadline(t) }

// Hijack hands the connection over (a WebSocket the worker accepted).
func (w *h1writer) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	if w.wroteHeader {
		return nil, nil, errors.New("the answer has begun")
	}
	w.hijacked = true
	w.c.cr.abortPendingRead()
	_ = w.c.raw.SetDeadline(time.Time{})
	return w.c.raw, bufio.NewReadWriter(w.c.br, w.c.bw), nil
}

// finish ends the answer: its head if not yet sent, the last chunk and trailers, and sends it.
func (w *h1writer) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headSent {
		w.sendHead(true)
	}
	if w.err != nil {
		return w.err
	}
	bw := w.c.bw
	if w.chunked {
		bw.WriteString("0\r\n")
		for k, vv := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vv {
					writeField(bw, http.CanonicalHeaderKey(name), headerValue(v))
				}
			}
		}
		bw.WriteString("\r\n")
	}
	if w.length >= 0 && w.written < w.length && !w.noBody {
		// Shorter than declared: the client must not take it as whole.
		_ = bw.Flush()
		return errors.New("answer shorter than its Content-Length")
	}
	return bw.Flush()
}

// connReader is what a connection's bufio.Reader reads from. Between a request read whole and
// the start of its answer it keeps one read pending on the connection (a background read, as
// net/http's server does), so that a client that leaves while the worker works is noticed: its
// EOF or reset cancels the connection's context. A byte that read gets is handed to the next read
// (the next request's first). Outside that window no read is pending. The background read costs a
// goroutine, system calls and wake-ups, so it begins only once the answer has not begun within
// backgroundReadDelay: most answers come sooner, and pay nothing for it (a client that leaves is
// noticed that much later).
type connReader struct {
	c       *h1conn
	mu      sync.Mutex
	cond    *sync.Cond
	inBG    bool // a background read is pending
	hasByte bool
	b       [1]byte
	// armed: the background read begins when timer fires (startBackgroundRead), unless the
	// answer began first (abortPendingRead) or the connection is read again.
	armed bool
	timer *time.Timer
}

// backgroundReadDelay is how long a request whose answer has not begun waits before the edge
// watches its client's connection for a close.
const backgroundReadDelay = 10 * time.Millisecond

func (r *connReader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.mu.Lock()
	r.disarmLocked()
	for r.inBG {
		r.cond.Wait() // not expected: the loop ends the background read before reading
	}
	if r.hasByte {
		p[0], r.hasByte = r.b[0], false
		r.mu.Unlock()
		return 1, nil
	}
	r.mu.Unlock()
	n, err := r.c.raw.Read(p)
	if err != nil {
		r.c.cancel(err)
	}
	return n, err
}

// startBackgroundRead arms the background read, to begin after backgroundReadDelay, unless one
// is pending or armed or a byte is kept.
func (r *connReader) startBackgroundRead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inBG || r.hasByte || r.armed {
		return
	}
	r.armed = true
	if r.timer == nil {
		r.timer = time.AfterFunc(backgroundReadDelay, r.armedRead)
	} else {
		r.timer.Reset(backgroundReadDelay)
	}
}

// armedRead begins the armed background read, in the timer's own goroutine (a firing that the
// answer's beginning disarmed meanwhile does nothing).
func (r *connReader) armedRead() {
	r.mu.Lock()
	if !r.armed || r.inBG || r.hasByte {
		r.mu.Unlock()
		return
	}
	r.armed, r.inBG = false, true
	r.mu.Unlock()
	r.backgroundRead()
}

// disarmLocked stops an armed background read from beginning (r.mu held).
func (r *connReader) disarmLocked() {
	if r.armed {
		r.armed = false
		r.timer.Stop()
	}
}

func (r *connReader) backgroundRead() {
	n, err := r.c.raw.Read(r.b[:])
	r.mu.Lock()
	if n == 1 {
		r.hasByte = true
	}
	// A deadline that passed is the server's own doing (abortPendingRead, or a handler's): not the
	// client leaving.
	if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
		r.c.cancel(err)
	}
	r.inBG = false
	r.cond.Broadcast()
	r.mu.Unlock()
}

// abortPendingRead ends the background read, if one is pending, and waits for it.
func (r *connReader) abortPendingRead() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.disarmLocked()
	if !r.inBG {
		return
	}
	_ = r.c.raw.SetReadDeadline(aLongTimeAgo)
	for r.inBG {
		r.cond.Wait()
	}
	_ = r.c.raw.SetReadDeadline(time.Time{})
}

// connWriter is what a connection's bufio.Writer writes to: a failed write cancels the
// connection's context.
type connWriter struct{ c *h1conn }

func (w connWriter) Write(p []byte) (int, error) {
	n, err := w.c.raw.Write(p)
	if err != nil {
		w.c.cancel(err)
	}
	return n, err
}
