package edge

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// aLongTimeAgo is a deadline that has passed: setting it ends a connection's pending reads and
// writes at once.
var aLongTimeAgo = time.Unix(1, 0)

var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// forward sends r to target's process, for target's incarnation, and copies its answer to w,
// within the edge's limits. It returns the status the client was answered with.
//
// A request is never replayed on another connection: a request that made the worker's process die
// (or be killed for looping) would run again in the restarted process and take it down too. An
// idle connection is checked before it is used instead (upConn.open).
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, target Target, limit time.Duration, flight Flight) int {
	start := time.Now()
	deadline := start.Add(limit)
	var body *clientBody
	// A request whose length is known to be zero has no body to carry (an HTTP/2 request with no
	// DATA frames has ContentLength 0 but a Body that is not http.NoBody): it goes as a plain
	// request, with no body writer beside the answer's read.
	if r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0 {
		if r.ContentLength > h.limits.MaxBodyBytes {
			withdraw(flight) // its worker never sees it: no request of the worker's to blame
			return h.refuse(w, http.StatusRequestEntityTooLarge)
		}
		rc := http.NewResponseController(w)
		// A body that trickles in is cut at BodyTimeout (408); the deadline is lifted once it is
		// whole, so that the server's wait for the client's next request is not cut by it.
		_ = rc.SetReadDeadline(start.Add(h.limits.BodyTimeout))
		body = &clientBody{r: http.MaxBytesReader(w, r.Body, h.limits.MaxBodyBytes), rc: rc}
	}

	c, err := h.up.get(target.Addr(), deadline)
	if err != nil {
		withdraw(flight) // nothing was sent: its process is gone, not stuck on it
		return h.failed(w, r, nil, deadline, err)
	}
	_ = c.conn.SetDeadline(deadline)
	// A client that goes away ends the upstream request with it.
	stop := context.AfterFunc(r.Context(), func() { _ = c.conn.SetDeadline(aLongTimeAgo) })
	reusable := false
	defer func() {
		// A client gone as the answer ended (an HTTP/2 stream's context ends with its handler)
		// moves, or is about to move, the connection's deadline into the past: such a
		// connection is never kept, or the next request on it would fail at once.
		if !stop() {
			reusable = false
		}
		if reusable {
			h.up.put(c)
		} else {
			c.conn.Close()
		}
	}()

	h.writeHead(c.bw, r, body != nil, target.Incarnation())
	// The head goes at once, before any of the body: the worker's process starts on the request
	// (and does not time out a connection it sees no request on) while the body streams in.
	if err := c.bw.Flush(); err != nil {
		return h.failed(w, r, nil, deadline, err)
	}
	var sent chan error
	if body != nil {
		sent = make(chan error, 1)
		go func() {
			err := writeBody(c.bw, body, r.ContentLength)
			if err != nil && (body.error() != nil || errors.Is(err, io.ErrUnexpectedEOF)) {
				// The client's body broke or came short: whatever the worker is waiting for will
				// not come, so the exchange ends. (A write the worker's side refused is no reason
				// to stop reading: its answer, or its end, may be there to read.)
				_ = c.conn.SetDeadline(aLongTimeAgo)
			}
			sent <- err
		}()
	}
	// bodySent waits for the body's writer; when the answer is complete while the client is still
	// sending, the rest of its body is not read (nor its connection kept).
	bodySent := func() error {
		if sent == nil {
			return nil
		}
		select {
		case err := <-sent:
			return err
		default:
			_ = c.conn.SetDeadline(aLongTimeAgo)
			_ = body.rc.SetReadDeadline(aLongTimeAgo)
			<-sent
			return errors.New("the worker answered before reading the whole body")
		}
	}

	c.lim.n = maxAnswerHeaderBytes
	resp, err := http.ReadResponse(c.br, r)
	for err == nil && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		resp, err = http.ReadResponse(c.br, r) // 1xx: informational, not passed on
	}
	c.lim.n = math.MaxInt64
	if err == nil {
		flight.Answered()
	}
	if err != nil {
		_ = c.conn.SetDeadline(aLongTimeAgo)
		var clientErr error
		if sent != nil {
			select {
			case <-sent:
				clientErr = body.error()
			default:
				// Still sending (the worker broke, or the response time ran out, or the client's
				// body time did, which ends the exchange too and may be seen here first): its
				// read is ended, and what the client did decides the answer.
				_ = body.rc.SetReadDeadline(aLongTimeAgo)
				<-sent
				clientErr = body.error()
				if errors.Is(clientErr, os.ErrDeadlineExceeded) && time.Now().Before(start.Add(h.limits.BodyTimeout)) {
					clientErr = nil // the read this ended, not the client's body time
				}
			}
		}
		return h.failed(w, r, clientErr, deadline, err)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		// The tunnel outlives the request: the client's half-close must not cut the worker's side.
		stop()
		h.tunnel(w, r, c, resp, flight)
		return http.StatusSwitchingProtocols
	}

	dst := w.Header()
	drop := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if hopByHop(k) || (len(drop) > 0 && listed(drop, k)) {
			continue
		}
		dst[k] = vv
	}
	for k := range resp.Trailer {
		dst.Add("Trailer", k)
	}
	w.WriteHeader(resp.StatusCode)
	copyErr := copyBody(w, resp.Body, resp.ContentLength < 0)
	resp.Body.Close()
	bodyErr := bodySent()
	if copyErr != nil {
		// The answer started and cannot be finished: abort it so that the client sees it broken,
		// not short.
		if r.Context().Err() == nil {
			h.log.Warn("edge: an answer was cut off", "host", r.Host, "error", copyErr, "timeout", time.Now().After(deadline))
		}
		panic(http.ErrAbortHandler)
	}
	for k, vv := range resp.Trailer {
		dst[http.TrailerPrefix+k] = vv
	}
	reusable = !resp.Close && bodyErr == nil
	return resp.StatusCode
}

// failed answers a request whose exchange with the worker broke before its answer began;
// clientErr is the error reading the client's body, if any.
func (h *Handler) failed(w http.ResponseWriter, r *http.Request, clientErr error, deadline time.Time, err error) int {
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(clientErr, &tooLarge):
		return h.refuse(w, http.StatusRequestEntityTooLarge)
	case errors.Is(clientErr, os.ErrDeadlineExceeded):
		return h.refuse(w, http.StatusRequestTimeout)
	}
	if !time.Now().Before(deadline) {
		writeProblem(w, problemResponseTimeout)
		return http.StatusGatewayTimeout
	}
	if r.Context().Err() == nil {
		h.log.Warn("edge upstream error", "host", r.Host, "error", err)
	}
	writeProblem(w, problemBadGateway)
	return http.StatusBadGateway
}

// refuse answers a request the edge will not carry, and closes its connection (what is left of
// its body is not read).
func (h *Handler) refuse(w http.ResponseWriter, status int) int {
	w.Header().Set("Connection", "close")
	switch status {
	case http.StatusRequestEntityTooLarge:
		writeProblem(w, problemBodyTooLarge)
	case http.StatusRequestTimeout:
		writeProblem(w, problemBodyTimeout)
	default:
		writeProblem(w, problemBadFraming)
	}
	return status
}

// The edge's error answers. None names a socket, a script or an error of Go (SPEC 5.1).
var (
	problemBadGateway = adminapi.NewProblem(http.StatusBadGateway, adminapi.CodeUpstreamError, "Bad Gateway",
		"the worker's runtime did not answer")
	problemResponseTimeout = adminapi.NewProblem(http.StatusGatewayTimeout, adminapi.CodeResponseTimeout, "Gateway Timeout",
		"the worker did not answer within the runtime node's response time limit")
	problemBodyTooLarge = adminapi.NewProblem(http.StatusRequestEntityTooLarge, adminapi.CodeBodyTooLarge, "Content Too Large",
		"the request body is larger than the runtime node accepts")
	problemBodyTimeout = adminapi.NewProblem(http.StatusRequestTimeout, adminapi.CodeBodyTimeout, "Request Timeout",
		"the request body did not arrive within the runtime node's time limit")
	problemBadFraming = adminapi.NewProblem(http.StatusBadRequest, adminapi.CodeBadFraming, "Bad Request",
		"a request may carry Content-Length or Transfer-Encoding, not both (RFC 9112 6.1)")
)

// clientBody is the client's request body on its way to the worker; it keeps the first error
// reading it, to tell the client's fault from the worker's.
type clientBody struct {
	r   io.Reader
	rc  *http.ResponseController
	mu  sync.Mutex
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		_ = b.rc.SetReadDeadline(time.Time{})
	} else if err != nil {
		b.mu.Lock()
		if b.err == nil {
			b.err = err
		}
		b.mu.Unlock()
	}
	return n, err
}

func (b *clientBody) error() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

// writeBody sends the client's body after the head: by its length, or chunked.
func writeBody(bw *bufio.Writer, body *clientBody, length int64) error {
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	if length > 0 {
		n, err := io.CopyBuffer(writerOnly{bw}, body, *bufp)
		if err == nil && n != length {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return err
		}
		return bw.Flush()
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	cw := httputil.NewChunkedWriter(bw)
	if _, err := io.CopyBuffer(flushingWriter{cw, bw}, body, *bufp); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return err
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		return err
	}
	return bw.Flush()
}

// flushingWriter sends each chunk as it comes, so that a streamed body streams on.
type flushingWriter struct {
	w  io.Writer
	bw *bufio.Writer
}

func (f flushingWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		err = f.bw.Flush()
	}
	return n, err
}

type writerOnly struct{ io.Writer }

// copyBody copies the worker's answer to the client; a streamed one (no length) is flushed as it
// comes.
func copyBody(w http.ResponseWriter, body io.Reader, stream bool) error {
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	buf := *bufp
	flusher, _ := w.(http.Flusher)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return werr
			}
			if stream && flusher != nil {
				flusher.Flush()
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// writeHead writes the request line and headers the worker receives: the client's, without
// hop-by-hop headers nor the runtime's own (Takoform-*), with forwarding headers the edge sets
// (see forwarded), the incarnation the router is to hand it to, and the body's framing.
func (h *Handler) writeHead(bw *bufio.Writer, r *http.Request, hasBody bool, incarnation string) {
	uri := r.RequestURI
	if uri == "" || uri[0] != '/' {
		uri = r.URL.RequestURI() // absolute form, or "*"
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	drop := r.Header["Connection"]
	for k, vv := range r.Header {
		if hopByHop(k) || internalHeader(k) || forwardingHeader(k) || k == "Content-Length" || k == "Expect" ||
			(len(drop) > 0 && listed(drop, k)) {
			continue
		}
		for _, v := range vv {
			writeField(bw, k, v)
		}
	}
	if upgrade := r.Header.Get("Upgrade"); upgrade != "" && listed(drop, "Upgrade") {
		writeField(bw, "Connection", "Upgrade")
		writeField(bw, "Upgrade", upgrade)
	}
	if te := r.Header["Te"]; len(te) > 0 && listed(te, "trailers") {
		writeField(bw, "Te", "trailers") // gRPC needs it
	}
	h.forwarded(bw, r)
	if incarnation != "" {
		writeField(bw, IncarnationHeader, incarnation)
	}
	switch {
	case hasBody && r.ContentLength > 0:
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n")
	case hasBody:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

// hopByHop reports the headers of one connection, never forwarded (RFC 9110 7.6.1).
func hopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// IncarnationHeader names the incarnation a request is for, to its process's router (the one
// header of the runtime's a worker's process receives from the edge; the router removes it).
const IncarnationHeader = "Takoform-Incarnation"

// internalHeader reports the runtime's own headers (Takoform-*, such as the probe's): a client's
// copy never reaches a worker, so a worker can trust what it sees of them.
func internalHeader(k string) bool {
	return len(k) >= len("Takoform-") && strings.EqualFold(k[:len("Takoform-")], "Takoform-")
}

// listed reports whether the comma-separated tokens of values name k (case-insensitively).
func listed(values []string, k string) bool {
	for _, v := range values {
		for v != "" {
			var token string
			token, v, _ = strings.Cut(v, ",")
			if strings.EqualFold(strings.TrimSpace(token), k) {
				return true
			}
		}
	}
	return false
}

// tunnel carries a connection the worker switched to another protocol (a WebSocket) both ways
// until either side closes it. The response time limit ended with the switch.
func (h *Handler) tunnel(w http.ResponseWriter, r *http.Request, c *upConn, resp *http.Response, flight Flight) {
	cc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		writeProblem(w, problemBadGateway)
		return
	}
	defer cc.Close()
	_ = cc.SetDeadline(time.Time{})
	_ = c.conn.SetDeadline(time.Time{})
	resp.Body = nil
	if err := resp.Write(brw); err != nil || brw.Flush() != nil {
		return
	}
	done := make(chan struct{}, 2)
	var toWorker, toClient io.Writer = c.conn, cc
	if f, ok := flight.(TunnelFlight); ok {
		toWorker, toClient = tellingWriter{c.conn, f.Input}, tellingWriter{cc, f.Output}
	}
	go func() {
		_, _ = io.Copy(toWorker, brw.Reader)
		_ = c.conn.CloseWrite()
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(toClient, c.br)
		if cw, ok := cc.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		done <- struct{}{}
	}()
	<-done
	<-done
}

// tellingWriter calls tell before every write of something (so that a worker's answer to what it
// was sent is always told after it).
type tellingWriter struct {
	w    io.Writer
	tell func()
}

func (w tellingWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		w.tell()
	}
	return w.w.Write(p)
}
