package edge

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// FuzzReadHead feeds the edge's request parser arbitrary bytes. Whatever it accepts must be a
// request net/http's parser reads the same way (the edge is only ever stricter), with no control
// character in any field, one framing of its body, and a body read to its declared end.
//
//	go test -run '^$' -fuzz FuzzReadHead ./internal/runtime/edge
func FuzzReadHead(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /p?q HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\nT: 1\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET http://h/x HTTP/1.0\nX: a\n b\n\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nX\x00: 1\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var lr lineReader
		h, perr := readHead(bufio.NewReaderSize(bytes.NewReader(data), 4096), 8<<10, &lr)
		if perr != nil || h.badFraming {
			return
		}
		req, perr := h.request()
		if perr != nil {
			return
		}
		if !isToken([]byte(req.Method)) || !validHost(req.Host) && req.Host != "" {
			t.Fatalf("accepted a bad method or host: %q %q", req.Method, req.Host)
		}
		for k, vv := range req.Header {
			if !isToken([]byte(k)) {
				t.Fatalf("accepted field name %q", k)
			}
			for _, v := range vv {
				if strings.ContainsAny(v, "\r\n\x00") {
					t.Fatalf("accepted field value %q", v)
				}
			}
		}
		if req.Header.Get("Transfer-Encoding") != "" || (h.chunked && req.Header.Get("Content-Length") != "") {
			t.Fatalf("two framings: chunked=%v %v", h.chunked, req.Header)
		}
		// net/http's parser, on the same bytes, reads the same request.
		std, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(data)))
		if err != nil {
			t.Fatalf("the edge accepted what net/http refuses (%v): %q", err, data)
		}
		if std.Method != req.Method || std.RequestURI != req.RequestURI || std.Host != req.Host || std.ContentLength != req.ContentLength ||
			std.Close != req.Close && !listed(req.Header["Connection"], "close") {
			t.Fatalf("parsed apart:\nedge     %s %s host=%q length=%d close=%v\nnet/http %s %s host=%q length=%d close=%v",
				req.Method, req.RequestURI, req.Host, req.ContentLength, req.Close, std.Method, std.RequestURI, std.Host, std.ContentLength, std.Close)
		}
		for k, vv := range req.Header {
			if k == "Host" {
				continue
			}
			if strings.Join(std.Header[k], "\n") != strings.Join(vv, "\n") {
				t.Fatalf("field %s: edge %q, net/http %q", k, vv, std.Header[k])
			}
		}
	})
}

// FuzzChunkedBody feeds the chunked body reader arbitrary bytes: what it reads whole, net/http's
// reader reads too, to the same bytes.
func FuzzChunkedBody(f *testing.F) {
	for _, seed := range []string{"3\r\nabc\r\n0\r\n\r\n", "3;e=1\r\nabc\r\na\r\n0123456789\r\n0\r\nT: 1\r\n\r\n", "g\r\n\r\n", "3\r\nabcd\r\n0\r\n\r\n", "3\nabc\r\n0\r\n\r\n", "3\r\nabc\n0\n\n",
		strings.Repeat("1;"+strings.Repeat("e", 4000)+"\r\nx\r\n", 8) + "0\r\n\r\n"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c := &chunkedBody{br: bufio.NewReaderSize(bytes.NewReader(data), 4096), budget: 8 << 10}
		got, err := io.ReadAll(c)
		if err != nil {
			return
		}
		req := "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + string(data)
		std, err := http.ReadRequest(bufio.NewReader(strings.NewReader(req)))
		if err != nil {
			t.Fatalf("net/http refused the head: %v", err)
		}
		want, err := io.ReadAll(std.Body)
		if err != nil {
			t.Fatalf("the edge read a chunked body net/http refuses (%v): %q", err, data)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("read apart: edge %q, net/http %q", got, want)
		}
	})
}
