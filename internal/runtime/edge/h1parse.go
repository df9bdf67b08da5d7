package edge

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
)

// The edge's own HTTP/1.x request parser (RFC 9112), strict where net/http is lenient in ways that
// let a front proxy and the edge disagree on where a request ends:
//   - a folded header line (obs-fold) is refused (net/http joins it to the previous field);
//   - a repeated Content-Length is refused even when both copies agree (net/http keeps one);
//   - an absolute-form target's host is held to the characters of a Host header;
//   - a trailer field of a chunked body is held to the rules of a header field (net/http lets a
//     name with spaces through there, so that a request line can pass for a trailer);
//   - a field name followed by whitespace before its colon, a control character (NUL among them)
//     or a bare CR anywhere in the head is refused, as net/http does.
//
// A line may end with CRLF or a bare LF (RFC 9112 2.2; net/http and nginx accept both).

// parseError is a request the parser refuses: status is what the client is answered, and the
// connection is closed after it. A zero status means the connection failed (or the client left)
// before a request was whole: nothing is answered.
type parseError struct {
	status int
	why    string
}

func (e *parseError) Error() string { return strconv.Itoa(e.status) + " " + e.why }

var errConnGone = &parseError{why: "connection ended"}

func refused(status int, why string) *parseError { return &parseError{status: status, why: why} }

// head is what the parser makes of a request's line and header block.
type head struct {
	method, target string
	major, minor   int
	header         http.Header
	host           string // the Host header's value ("" with hasHost false: none)
	hasHost        bool
	length         int64 // Content-Length, or -1 when the body is chunked
	chunked        bool
	close          bool // the connection ends after this request (HTTP/1.0 without keep-alive, Connection: close)
	badFraming     bool // both Content-Length and Transfer-Encoding, or Transfer-Encoding on HTTP/1.0
}

// lineReader reads a request's head line by line within a byte budget.
type lineReader struct {
	br     *bufio.Reader
	budget int // bytes of the head left
	long   []byte
	crlf   bool // lines must end with CRLF (a chunked body's, as net/http wants them)
	// values and fields are readHead's, kept for the connection's next request: the bytes of a
	// head's values, and where each field's value lies in them.
	values []byte
	fields []field
}

// maxKeptFields is the most fields a connection keeps room for between requests (a head of
// thousands of short fields fits the header budget).
const maxKeptFields = 128

// field is one header field of a head: its canonical name, and where its value lies in the head's
// values.
type field struct {
	key        string
	start, end int
}

// line returns the next line without its terminator. A line that takes the budget past zero is a
// 431.
func (r *lineReader) line() ([]byte, *parseError) {
	r.long = r.long[:0]
	for {
		b, err := r.br.ReadSlice('\n')
		r.budget -= len(b)
		if r.budget < 0 {
			return nil, refused(http.StatusRequestHeaderFieldsTooLarge, "request header fields too large")
		}
		switch {
		case err == nil:
			if len(r.long) > 0 {
				r.long = append(r.long, b...)
				b = r.long
			}
			b = b[:len(b)-1]
			if n := len(b); n > 0 && b[n-1] == '\r' {
				b = b[:n-1]
			} else if r.crlf {
				return nil, refused(http.StatusBadRequest, "bare LF")
			}
			return b, nil
		case errors.Is(err, bufio.ErrBufferFull):
			r.long = append(r.long, b...)
		default:
			return nil, errConnGone
		}
	}
}

// readHead reads a request's line and header block (at most maxBytes together).
func readHead(br *bufio.Reader, maxBytes int, lr *lineReader) (*head, *parseError) {
	lr.br, lr.budget = br, maxBytes
	line, perr := lr.line()
	if perr != nil {
		return nil, perr
	}
	h := &head{length: 0}
	if perr := h.requestLine(line); perr != nil {
		return nil, perr
	}
	// The values are gathered into one buffer and made one string, of which each is a part, and
	// the header's value lists share one array: a request's head costs a few allocations, not two
	// for each of its fields.
	lr.values, lr.fields = lr.values[:0], lr.fields[:0]
	for {
		line, perr := lr.line()
		if perr != nil {
			return nil, perr
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return nil, refused(http.StatusBadRequest, "folded header line")
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) {
			return nil, refused(http.StatusBadRequest, "invalid header name")
		}
		value := trimOWS(line[colon+1:])
		if !validValue(value) {
			return nil, refused(http.StatusBadRequest, "invalid header value")
		}
		start := len(lr.values)
		lr.values = append(lr.values, value...)
		lr.fields = append(lr.fields, field{key: canonicalKey(line[:colon]), start: start, end: len(lr.values)})
	}
	all := string(lr.values)
	lists := make([]string, 0, len(lr.fields))
	h.header = make(http.Header, len(lr.fields))
	var lengths, encodings, hosts int
	var lengthValue, encodingValue string
	for _, f := range lr.fields {
		v := all[f.start:f.end]
		switch f.key {
		case "Host":
			hosts++
			h.host = v
			continue // kept out of Header, as net/http does
		case "Content-Length":
			lengths++
			lengthValue = v
		case "Transfer-Encoding":
			encodings++
			encodingValue = v
		}
		if cur := h.header[f.key]; cur != nil {
			h.header[f.key] = append(cur, v) // a repeated field: its own array from here
			continue
		}
		lists = append(lists, v)
		h.header[f.key] = lists[len(lists)-1 : len(lists) : len(lists)]
	}
	// A large head's buffers are not held for the connection's life.
	if cap(lr.values) > maxKeptLine {
		lr.values = nil
	}
	if cap(lr.fields) > maxKeptFields {
		lr.fields = nil
	}
	if h.major != 1 {
		return nil, refused(http.StatusHTTPVersionNotSupported, "unsupported protocol version")
	}
	http11 := h.minor >= 1 // a later HTTP/1.x is answered as HTTP/1.1 (RFC 9110 6.2)
	switch {
	case hosts > 1:
		return nil, refused(http.StatusBadRequest, "too many Host headers")
	case hosts == 0 && http11:
		return nil, refused(http.StatusBadRequest, "missing required Host header")
	case hosts == 1 && !validHost(h.host):
		return nil, refused(http.StatusBadRequest, "malformed Host header")
	}
	h.hasHost = hosts == 1

	// The framing of the body (RFC 9112 6).
	if encodings > 0 {
		if !http11 || lengths > 0 {
			// Refused by the edge's handler (a problem answer), and the connection closed.
			h.badFraming, h.close = true, true
			return h, nil
		}
		if encodings > 1 || !strings.EqualFold(encodingValue, "chunked") {
			return nil, refused(http.StatusNotImplemented, "unsupported transfer encoding")
		}
		h.chunked, h.length = true, -1
		delete(h.header, "Transfer-Encoding") // hop-by-hop; the request says it is chunked (as net/http does)
	} else if lengths > 0 {
		if lengths > 1 {
			return nil, refused(http.StatusBadRequest, "more than one Content-Length")
		}
		n, ok := parseLength(lengthValue)
		if !ok {
			return nil, refused(http.StatusBadRequest, "bad Content-Length")
		}
		h.length = n
	}
	conn := h.header["Connection"]
	h.close = listed(conn, "close") || (!http11 && !listed(conn, "keep-alive"))
	return h, nil
}

// requestLine reads "METHOD target HTTP/x.y".
func (h *head) requestLine(line []byte) *parseError {
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return refused(http.StatusBadRequest, "malformed request line")
	}
	rest := line[sp1+1:]
	sp2 := bytes.IndexByte(rest, ' ')
	if sp2 <= 0 {
		return refused(http.StatusBadRequest, "malformed request line")
	}
	method, target, proto := line[:sp1], rest[:sp2], rest[sp2+1:]
	if !isToken(method) {
		return refused(http.StatusBadRequest, "invalid method")
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return refused(http.StatusBadRequest, "malformed request target")
		}
	}
	if len(proto) != 8 || string(proto[:5]) != "HTTP/" || proto[6] != '.' || !isDigit(proto[5]) || !isDigit(proto[7]) {
		return refused(http.StatusBadRequest, "malformed HTTP version")
	}
	h.method, h.target = string(method), string(target)
	h.major, h.minor = int(proto[5]-'0'), int(proto[7]-'0')
	return nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// parseLength reads a Content-Length: digits only, no sign, within int64.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}

// tokenChars marks the characters of a token (RFC 9110 5.6.2).
var tokenChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = true
	}
	return t
}()

func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if !tokenChars[c] {
			return false
		}
	}
	return true
}

// validValue reports a field value without control characters other than HTAB (RFC 9110 5.5);
// obs-text (0x80-0xff) is allowed.
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validHost reports a Host value made only of the characters a host and port may hold
// (RFC 3986 3.2.2: unreserved, sub-delims, percent-encoding, and ":[]" of IPv6 and the port), the
// same set net/http checks.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		if !hostChars[h[i]] {
			return false
		}
	}
	return true
}

var hostChars = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = true, true
	}
	for _, c := range "-._~" + "!$&'()*+,;=" + "%" + ":[]" {
		t[c] = true
	}
	return t
}()

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// commonKeys interns the canonical form of frequent field names, to spare an allocation each.
var commonKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Length", "Content-Type", "Cookie", "Expect", "Host", "Origin", "Referer",
		"Transfer-Encoding", "Upgrade", "User-Agent", "X-Forwarded-For", "X-Forwarded-Proto", "X-Forwarded-Host",
		"X-Real-Ip", "Forwarded", "Te", "Keep-Alive"} {
		m[k] = k
	}
	return m
}()

func canonicalKey(b []byte) string {
	if k, ok := commonKeys[string(b)]; ok { // no allocation: the compiler looks a []byte key up in place
		return k
	}
	return textproto.CanonicalMIMEHeaderKey(string(b))
}

// request builds the http.Request the handler receives from h.
func (h *head) request() (*http.Request, *parseError) {
	r := &http.Request{
		Method: h.method, RequestURI: h.target, Header: h.header,
		ProtoMajor: h.major, ProtoMinor: h.minor, Close: h.close, ContentLength: h.length,
		Host: h.host,
	}
	r.Proto = "HTTP/1.1"
	if h.chunked {
		r.TransferEncoding = []string{"chunked"}
	}
	if h.minor == 0 {
		r.Proto = "HTTP/1.0"
	}
	var err error
	if h.method == http.MethodConnect && !strings.HasPrefix(h.target, "/") {
		r.URL, err = url.ParseRequestURI("http://" + h.target)
		if err == nil {
			r.URL.Scheme = ""
		}
	} else {
		r.URL, err = url.ParseRequestURI(h.target)
	}
	if err != nil {
		return nil, refused(http.StatusBadRequest, "malformed request target")
	}
	if r.URL.Host != "" {
		// An absolute-form target names the host (RFC 9112 3.2.2); it is held to the Host
		// header's characters (net/http lets any through).
		r.Host = r.URL.Host
		if !validHost(r.Host) {
			return nil, refused(http.StatusBadRequest, "malformed host in the request target")
		}
	}
	return r, nil
}

// chunkedBody reads a chunked request body (RFC 9112 7.1) strictly: a size line of hex digits
// with optional extensions, the data and its CRLF, and trailer fields, which are read within the
// head's byte budget and dropped (the edge passes no request trailers on). Like net/http's reader
// (since CVE-2023-39326) it bounds the overhead of size lines and extensions beyond a fair share of
// the data they frame: a body of tiny chunks with long extensions is refused.
type chunkedBody struct {
	br      *bufio.Reader
	lr      lineReader
	left    int64 // of the current chunk
	excess  int64 // size-line bytes beyond the allowance of the chunks read so far
	budget  int
	started bool
	done    bool
	err     error
}

// Chunk overhead allowed: maxChunkLine bytes per size line, chunkAllowance bytes per chunk plus
// twice its data for free, and at most maxChunkExcess beyond that over the whole body (net/http's
// figures).
const (
	maxChunkLine   = 4096
	chunkAllowance = 16
	maxChunkExcess = 16 << 10
)

var (
	errBadChunk      = errors.New("malformed chunked body")
	errChunkOverhead = errors.New("chunked body with too much overhead")
	errBadTrailer    = errors.New("malformed trailer field")
)

func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		if c.started {
			// the CRLF after a chunk's data
			b, err := c.br.ReadByte()
			if err == nil && b != '\r' {
				return 0, c.fail(errBadChunk)
			}
			if err == nil {
				b, err = c.br.ReadByte()
			}
			if err == nil && b != '\n' {
				return 0, c.fail(errBadChunk)
			}
			if err != nil {
				return 0, c.fail(err)
			}
		}
		c.started = true
		if err := c.size(); err != nil {
			return 0, c.fail(err)
		}
		if c.done {
			return 0, io.EOF
		}
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.br.Read(p)
	c.left -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		return n, c.fail(err)
	}
	return n, nil
}

func (c *chunkedBody) fail(err error) error {
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if errors.Is(err, bufio.ErrBufferFull) {
		err = errBadChunk
	}
	c.err = err
	return err
}

// size reads a chunk's size line; the last chunk's trailers are read too.
func (c *chunkedBody) size() error {
	c.lr.br, c.lr.budget, c.lr.crlf = c.br, maxChunkLine, true
	line, perr := c.lr.line()
	if perr != nil {
		if perr == errConnGone {
			return io.ErrUnexpectedEOF
		}
		return errBadChunk
	}
	c.excess += int64(maxChunkLine - c.lr.budget) // the line with its CRLF
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i] // extensions are ignored (RFC 9112 7.1.1), as net/http ignores them
	}
	line = bytes.TrimRight(line, " \t")
	if len(line) == 0 || len(line) > 15 {
		return errBadChunk
	}
	var n int64
	for _, d := range line {
		switch {
		case isDigit(d):
			n = n<<4 | int64(d-'0')
		case 'a' <= d && d <= 'f':
			n = n<<4 | int64(d-'a'+10)
		case 'A' <= d && d <= 'F':
			n = n<<4 | int64(d-'A'+10)
		default:
			return errBadChunk
		}
	}
	c.excess = max(c.excess-chunkAllowance-2*n, 0)
	if c.excess > maxChunkExcess {
		return errChunkOverhead
	}
	if n > 0 {
		c.left = n
		return nil
	}
	// The last chunk: trailer fields up to an empty line.
	c.lr.budget = c.budget
	for {
		line, perr := c.lr.line()
		if perr != nil {
			if perr == errConnGone {
				return io.ErrUnexpectedEOF
			}
			return errBadChunk
		}
		if len(line) == 0 {
			c.done = true
			return nil
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || !isToken(line[:colon]) || !validValue(trimOWS(line[colon+1:])) {
			return errBadTrailer
		}
	}
}

// lengthBody reads a body of a known length.
type lengthBody struct {
	br   *bufio.Reader
	left int64
	err  error
}

func (b *lengthBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.br.Read(p)
	b.left -= int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		b.err = err
	}
	return n, err
}
