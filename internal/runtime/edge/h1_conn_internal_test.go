package edge

import (
	"bufio"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
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
// gone. So are the buffers of a head of many fields (values and their index).
func TestOwnLoopDropsALongLinesBuffer(t *testing.T) {
	t.Parallel()
	_, addr := serveOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hw := w.(*h1writer)
		kept := cap(hw.c.lr.long)
		if cap(hw.c.lr.fields) > maxKeptFields || cap(hw.c.lr.values) > maxKeptLine {
			kept += cap(hw.c.lr.fields)*int(unsafe.Sizeof(field{})) + cap(hw.c.lr.values)
		}
		_, _ = io.WriteString(w, r.URL.Path+" "+strconv.Itoa(kept))
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
		"GET /many HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("a:b\r\n", 5000) + "\r\n",
		"GET /after HTTP/1.1\r\nHost: a\r\n\r\n",
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
			t.Fatalf("%s: the connection holds %s bytes of buffers for its heads", path, kept)
		}
	}
}

// syncBuffer is a log's destination that tests read while servers write to it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// A handler's panic ends its connection; one other than http.ErrAbortHandler is logged with its
// stack through the server's error log, an http.ErrAbortHandler is not logged.
func TestOwnLoopLogsAPanicWithItsStack(t *testing.T) {
	t.Parallel()
	var logged syncBuffer
	s := NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/abort" {
			panic(http.ErrAbortHandler)
		}
		panicInHandler()
	}), Limits{}, log.New(&logged, "", 0))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	for _, path := range []string{"/abort", "/bug"} {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: a\r\n\r\n")
		if _, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
			t.Fatalf("%s: answered after a panic", path)
		}
		c.Close()
		if path == "/abort" && logged.String() != "" {
			t.Fatalf("an http.ErrAbortHandler was logged: %s", logged.String())
		}
	}
	got := logged.String()
	if !strings.Contains(got, "edge: panic serving 127.0.0.1:") || !strings.Contains(got, "a bug in a handler") || !strings.Contains(got, "panicInHandler") {
		t.Fatalf("the panic was not logged with its stack: %q", got)
	}
}

func panicInHandler() { panic("a bug in a handler") }

// The background read that watches for a client leaving begins only once the answer has not
// begun within backgroundReadDelay: a worker that answers sooner costs the edge no goroutine,
// system call or wake-up for it, and one that takes longer is watched.
func TestOwnLoopWatchesTheClientOnlyForAnswersThatTakeAWhile(t *testing.T) {
	t.Parallel()
	_, addr := serveOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cr := w.(*h1writer).c.cr
		state := func() string {
			cr.mu.Lock()
			defer cr.mu.Unlock()
			return fmt.Sprintf("armed=%t watching=%t", cr.armed, cr.inBG)
		}
		at := state()
		if r.URL.Path == "/slow" {
			time.Sleep(50 * time.Millisecond) // five times backgroundReadDelay
			at += "; later " + state()
		}
		_, _ = io.WriteString(w, at)
	}), Limits{})
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, tc := range []struct{ path, want string }{
		{"/fast", "armed=true watching=false"},
		{"/slow", "armed=true watching=false; later armed=false watching=true"},
		{"/fast", "armed=true watching=false"},
	} {
		_, _ = io.WriteString(c, "GET "+tc.path+" HTTP/1.1\r\nHost: a\r\n\r\n")
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != tc.want {
			t.Fatalf("%s: %q, want %q", tc.path, b, tc.want)
		}
	}
}

// The background read that watches for a client leaving while the handler works hands any byte
// it reads to the next request: a request pipelined while the first waits for its answer is read
// whole, and the first request's context stays live (the client did not leave).
func TestOwnLoopHandsTheBackgroundReadsByteOn(t *testing.T) {
	t.Parallel()
	started := make(chan struct{}, 1)
	_, addr := serveOwn(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/first" {
			started <- struct{}{}
			time.Sleep(300 * time.Millisecond) // the worker works; the next request comes meanwhile
		}
		b, _ := io.ReadAll(r.Body)
		_, _ = io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(b)+" "+strconv.FormatBool(r.Context().Err() == nil))
	}), Limits{})
	for _, first := range []string{
		"GET /first HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /first HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody",
	} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		br := bufio.NewReader(c)
		_, _ = io.WriteString(c, first)
		<-started // the handler works, the background read is pending
		_, _ = io.WriteString(c, "POST /second HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
		var got []string
		for range 2 {
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			got = append(got, string(b))
		}
		c.Close()
		want := []string{"GET /first  true", "POST /second abc true"}
		if strings.HasPrefix(first, "POST") {
			want[0] = "POST /first body true"
		}
		if strings.Join(got, "|") != strings.Join(want, "|") {
			t.Fatalf("answers %q, want %q", got, want)
		}
	}
}

// The net/http server behind the edge serves HTTP/2 only: an HTTP/1 request that reached it (it
// never should: those are the own loop's) is not answered.
func TestH2ServerServesNoHTTP1(t *testing.T) {
	t.Parallel()
	s := newH2Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "served "+r.Proto)
	}), Limits{}, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(func() { _ = s.Close() })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
		t.Fatalf("the HTTP/2 server answered HTTP/1.1: %d", resp.StatusCode)
	}
}
