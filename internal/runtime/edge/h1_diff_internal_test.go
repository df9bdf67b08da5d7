package edge

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// diffLimits are the limits both servers of the differential test hold clients to. Header blocks
// the test sends are either well within MaxHeaderBytes or far beyond it: net/http counts its limit
// a little differently (its buffer's slack), so a block near the limit may be judged apart.
var diffLimits = Limits{HeaderTimeout: 5 * time.Second, IdleTimeout: 5 * time.Second, MaxHeaderBytes: 8 << 10}

// seen is what a server made of one request it accepted.
type seen struct {
	Method, Target, Host string
	Header               http.Header
	Length               int64
	Chunked, Close       bool
	Body                 string
}

// recordRequest answers each request with what it was parsed as (the edge's framing refusal
// first, as the edge's handler does it).
func recordRequest(w http.ResponseWriter, r *http.Request) {
	if refuseFraming(r) {
		w.Header().Set("Connection", "close")
		w.Header().Set("X-Refused", "framing") // an answer to HEAD has no body to say it
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "framing")
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.Header().Set("Connection", "close")
		w.Header().Set("X-Refused", "body: "+err.Error()) // an answer to HEAD has no body to say it
		w.WriteHeader(http.StatusUnprocessableEntity)
		_, _ = io.WriteString(w, "body: "+err.Error())
		return
	}
	h := r.Header.Clone()
	delete(h, "Transfer-Encoding")
	b, _ := json.Marshal(seen{Method: r.Method, Target: r.RequestURI, Host: r.Host, Header: h, Length: r.ContentLength,
		Chunked: slices.Contains(r.TransferEncoding, "chunked"), Close: r.Close, Body: string(body)})
	// In a header, with no body: a client reads an answer to HEAD like any other.
	w.Header().Set("X-Seen", string(b))
	w.Header().Set("Content-Length", "0")
}

// exchange sends raw on a new connection to addr, shuts the sending side, and returns what came
// back: per answer "ok <request as seen>" or "refused <status> <body>", and "-" where the
// connection ended without one.
func exchange(t *testing.T, addr, raw string) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		_, _ = io.WriteString(c, raw)
		_ = c.(*net.TCPConn).CloseWrite()
	}()
	br := bufio.NewReader(c)
	var out []string
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			return append(out, "-")
		}
		if resp.StatusCode < 200 {
			continue // 100 Continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return append(out, "cut")
		}
		if resp.StatusCode != http.StatusOK {
			out = append(out, strings.TrimSpace(fmt.Sprintf("refused %d %s %s", resp.StatusCode, resp.Header.Get("X-Refused"), strings.TrimSpace(string(b)))))
		} else {
			out = append(out, "ok "+resp.Header.Get("X-Seen")+string(b))
		}
		if resp.Close {
			return append(out, "-")
		}
	}
}

// diffServers starts the edge's own loop and plain net/http's HTTP/1 server with the same limits
// and handler.
func diffServers(t *testing.T) (own, std string) {
	t.Helper()
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := http.HandlerFunc(recordRequest)
	o := NewH1Server(h, diffLimits, nil)
	s := &http.Server{Handler: h, ReadHeaderTimeout: diffLimits.HeaderTimeout, IdleTimeout: diffLimits.IdleTimeout,
		MaxHeaderBytes: diffLimits.MaxHeaderBytes - headerSlack, DisableGeneralOptionsHandler: true}
	go func() { _ = o.Serve(lo) }()
	go func() { _ = s.Serve(ls) }()
	t.Cleanup(func() { _ = o.Close(); _ = s.Close() })
	return lo.Addr().String(), ls.Addr().String()
}

// Deliberate differences from net/http: the refusals below, and a "close" in any Connection field
// (not only the first) ends the connection after the answer.
//
// stricter names the refusals of the edge's parser that net/http's lacks, on purpose (h1parse.go),
// and "framing": a request framed both by Content-Length and Transfer-Encoding, or by
// Transfer-Encoding on HTTP/1.0, is refused by the edge and its connection closed (RFC 9112 6.1),
// where net/http reads it as chunked.
var stricter = []string{"folded header line", "more than one Content-Length", "malformed host in the request target", "malformed trailer field", "framing"}

// compare asserts that both servers made the same of raw, but for the edge's deliberate, stricter
// refusals: where the edge refused for one of those, net/http may have accepted.
func compare(t *testing.T, own, std, raw string) (accepted int) {
	t.Helper()
	a, b := exchange(t, own, raw), exchange(t, std, raw)
	for _, x := range a {
		if strings.HasPrefix(x, "ok ") {
			accepted++
		}
	}
	for i := range max(len(a), len(b)) {
		var x, y string
		if i < len(a) {
			x = a[i]
		}
		if i < len(b) {
			y = b[i]
		}
		if x == y {
			continue
		}
		if strings.HasPrefix(x, "refused") && slices.ContainsFunc(stricter, func(s string) bool { return strings.Contains(x, s) }) {
			return accepted // the rest of the connection is the edge's to close
		}
		if x == "-" && i > 0 && strings.Contains(a[i-1], `"Close":true`) {
			// The request asked for the connection to close (a "close" in any of its Connection
			// fields) and the edge closed it; net/http looks at the first Connection field only.
			return accepted
		}
		if refusal(x) && refusal(y) {
			return accepted // both refused (the statuses of a request wrong in several ways may differ), and closed
		}
		from := 0 // where the two answers part
		for from < len(x) && from < len(y) && x[from] == y[from] {
			from++
		}
		from = max(0, from-100)
		t.Fatalf("%s\nanswer %d, from byte %d:\nown loop: %s\nnet/http: %s", shown(raw), i, from, shown(x[min(from, len(x)):]), shown(y[min(from, len(y)):]))
	}
	return accepted
}

// refusal reports an answer that refused, or none (a connection ended, or reset while a refusal
// was read: a server that closes on a client still sending may reset the connection).
func refusal(s string) bool { return strings.HasPrefix(s, "refused") || s == "-" || s == "cut" }

// shown keeps a failure's message readable.
func shown(raw string) string {
	if len(raw) > 600 {
		return fmt.Sprintf("%q... (%d bytes)", raw[:600], len(raw))
	}
	return fmt.Sprintf("%q", raw)
}

// The edge's loop accepts and refuses what net/http's server does (but for its deliberate, stricter
// refusals), and parses what it accepts the same: method, target, Host, headers, body, keep-alive.
func TestOwnLoopParsesLikeNetHTTP(t *testing.T) {
	t.Parallel()
	own, std := diffServers(t)
	long := strings.Repeat("x", 20<<10)
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET /p?q=1&r=%20 HTTP/1.1\r\nHost: A.test:8080\r\nX-A: 1\r\nx-a: 2\r\nAccept:  spaced \t\r\n\r\n",
		"GET / HTTP/1.1\nHost: a.test\n\n", // bare LF
		"GET / HTTP/1.0\r\n\r\n",           // HTTP/1.0 needs no Host
		"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /2 HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\nGET /never HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"GET / HTTP/1.1\r\n\r\n",                       // missing Host
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", // two Hosts
		"GET / HTTP/1.1\r\nHost:\r\n\r\n",              // empty Host: accepted, as today (404 at the edge)
		"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",          // bad Host
		"GET http://abs.test/x HTTP/1.1\r\nHost: other\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
		"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
		"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-N: a\x00b\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-N: a\rb\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nBad Name: 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-A : 1\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n: empty\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nno colon\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Long: " + long + "\r\n\r\n", // 431
		"GET /" + long + " HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX-Folded: a\r\n b\r\n\r\n", // obs-fold: stricter
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n", // CRLF after a POST
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",                  // stricter
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nshort", // the client stops sending
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\nA\r\n0123456789\r\n0\r\nX-T: 1\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\nabc\r\n0\r\n\r\n",                                                             // a bare LF in a chunk's size line
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\n0\r\n\r\n",                                                             // and after its data
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",                              // a request line as a trailer: stricter
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1;"+strings.Repeat("e", 4000)+"\r\nx\r\n", 40) + "0\r\n\r\n", // chunk overhead
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + strings.Repeat("1\r\nx\r\n", 1000) + "0\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: a\r\nExpect: something\r\nContent-Length: 3\r\n\r\nabc",
		"HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n", // the client stops mid-head
		"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"garbage\r\n\r\n",
	} {
		compare(t, own, std, raw)
	}
}

// The same, on requests a seeded generator builds: valid ones and ones broken in the ways
// smuggling and parser confusion use, pipelined by up to three.
func TestOwnLoopParsesLikeNetHTTPOnGeneratedRequests(t *testing.T) {
	t.Parallel()
	own, std := diffServers(t)
	seed := uint64(time.Now().UnixNano())
	if v, err := strconv.ParseUint(os.Getenv("TAKOFORM_TEST_SEED"), 10, 64); err == nil {
		seed = v // to replay a failure
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	t.Logf("seed %d", seed)
	pick := func(options ...string) string { return options[rng.IntN(len(options))] }
	// Each part of a request is valid, or one of the ways it goes wrong, 1 time in 12.
	part := func(valid, broken []string) string {
		if rng.IntN(12) == 0 {
			return pick(broken...)
		}
		return pick(valid...)
	}
	one := func() string {
		eol := "\r\n"
		if rng.IntN(10) == 0 {
			eol = "\n"
		}
		var b strings.Builder
		b.WriteString(part([]string{"GET", "POST", "PUT", "HEAD", "DELETE", "get", "OPTIONS"}, []string{"G@T", "", "GET\x00"}) + " ")
		b.WriteString(part([]string{"/", "/a/b?c=d", "/%41", "http://abs.test/p", "*", "/" + strings.Repeat("p", 200)},
			[]string{"/a b", "/\x01", "", "/" + strings.Repeat("p", 20<<10)}) + " ")
		b.WriteString(part([]string{"HTTP/1.1", "HTTP/1.1", "HTTP/1.0"}, []string{"HTTP/2.0", "HTTP/1.1 ", "HTTP/1", "HTTP/1.10", "http/1.1"}) + eol)
		b.WriteString(part([]string{"Host: a.test", "Host: a.test:80", "host: A.TEST", "Host: [::1]:8", "Host:"},
			[]string{"", "Host: a b", "Host: a\x00", "Host: a\r\nHost: b", "Host: a\r\n Host: b"}) + eol)
		for range rng.IntN(4) {
			b.WriteString(part([]string{"X-A: 1", "Accept: */*", "X-Sp:  v  ", "X-Tab:\tv", "X-Empty:", "Connection: close",
				"Connection: keep-alive", "X-Obs: caf\xe9", "Expect: 100-continue", "Takoform-Probe: 1", "Te: trailers", "X-Folded-Not: a b"},
				[]string{"X-Bad Name: 1", "X-Nul: a\x00", "X-Ctl: \x7f", " folded", "\tfolded", "NoColon", "X-Long: " + strings.Repeat("l", 20<<10),
					"Expect: nope", "X-Cr: a\rb", ": v"}) + eol)
		}
		body := pick("", "", "hello", "0123456789", strings.Repeat("b", 5000))
		switch part([]string{"length", "length", "none", "chunked"}, []string{"badlength", "badencoding", "both"}) {
		case "none":
			body = ""
		case "length":
			b.WriteString(pick("Content-Length: ", "content-length: ", "Content-Length:") + fmt.Sprint(len(body)) + eol)
		case "badlength":
			b.WriteString(pick("Content-Length: 1, 1", "Content-Length: -1", "Content-Length: +5", "Content-Length: 5 5",
				"Content-Length: 5\r\nContent-Length: 5", "Content-Length: 5\r\nContent-Length: 7", "Content-Length: 0x5", "Content-Length: 99") + eol)
		case "chunked", "badencoding":
			if rng.IntN(12) == 0 {
				b.WriteString(pick("Transfer-Encoding: gzip", "Transfer-Encoding: chunked, gzip", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked") + eol)
			} else {
				b.WriteString(pick("Transfer-Encoding: chunked", "transfer-encoding: Chunked") + eol)
			}
			b.WriteString(eol)
			for len(body) > 0 {
				n := min(len(body), 1+rng.IntN(3000))
				b.WriteString(fmt.Sprintf("%x", n) + part([]string{"", ";x=y", ";x"}, []string{" ", ";\x01", "\x00"}) + eol + body[:n] + eol)
				body = body[n:]
			}
			b.WriteString(part([]string{"0" + eol + eol, "0" + eol + "X-T: 1" + eol + eol}, []string{"g" + eol + eol, "0" + eol, "0" + eol + "bad trailer" + eol + eol}))
			return b.String()
		case "both":
			b.WriteString("Content-Length: " + fmt.Sprint(len(body)) + eol + "Transfer-Encoding: chunked" + eol)
		}
		b.WriteString(eol)
		b.WriteString(body)
		return b.String()
	}
	accepted, sent := 0, 0
	for range 200 {
		var raw strings.Builder
		n := 1 + rng.IntN(3)
		for range n {
			raw.WriteString(one())
		}
		sent += n
		accepted += compare(t, own, std, raw.String())
	}
	t.Logf("%d of %d requests accepted by both", accepted, sent)
	if accepted < sent/10 {
		t.Fatalf("only %d of %d requests were accepted: the generator tests refusals only", accepted, sent)
	}
}
