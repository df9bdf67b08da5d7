package edge

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// serveOwn starts the edge's own loop with handler on a loopback port and returns its address.
func serveOwn(t *testing.T, handler http.Handler, l Limits) (*Server, string) {
	t.Helper()
	s := NewH1Server(handler, l, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	return s, ln.Addr().String()
}

// A header line longer than the connection's reader is read into a buffer of its own, which the
// connection does not keep for its keep-alive life: by the handler of the next request it is
// gone.
func TestOwnLoopDropsALongLinesBuffer(t *testing.T) {
	t.Parallel()
	_, addr := serveOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hw := w.(*h1writer)
		_, _ = io.WriteString(w, r.URL.Path+" "+strconv.Itoa(cap(hw.c.lr.long)))
	}), Limits{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, req := range []string{
		"GET /long HTTP/1.1\r\nHost: a\r\nX-Long: " + strings.Repeat("l", 32<<10) + "\r\n\r\n",
		"GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		path, kept, _ := strings.Cut(string(b), " ")
		if kept != "0" {
			t.Fatalf("%s: the connection holds a %s-byte line buffer", path, kept)
		}
	}
}
