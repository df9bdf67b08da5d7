package edge

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Shutdown drains as net/http's server does: it stops accepting, closes idle connections at once,
// lets a request in flight finish (its answer says the connection closes), and returns once none
// is left.
func TestOwnLoopShutdownDrains(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	s := NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			started <- struct{}{}
			<-release
		}
		_, _ = io.WriteString(w, "done "+r.URL.Path)
	}), Limits{}, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	addr := l.Addr().String()
	dial := func() (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		return c, bufio.NewReader(c)
	}
	// An idle kept-alive connection, and one with a request in flight.
	idle, idleR := dial()
	_, _ = io.WriteString(idle, "GET /fast HTTP/1.1\r\nHost: a\r\n\r\n")
	if resp, err := http.ReadResponse(idleR, nil); err != nil || resp.Close {
		t.Fatalf("first answer: %v", err)
	} else {
		_, _ = io.Copy(io.Discard, resp.Body)
	}
	busy, busyR := dial()
	_, _ = io.WriteString(busy, "GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	<-started

	done := make(chan error, 1)
	go func() { done <- s.Shutdown(context.Background()) }()
	// The idle connection is closed, and no new one is taken.
	if _, err := idleR.ReadByte(); err == nil {
		t.Fatal("an idle connection was kept open through the shutdown")
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatalf("Serve returned %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("a new connection was accepted after the shutdown began")
	}
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	resp, err := http.ReadResponse(busyR, nil)
	if err != nil {
		t.Fatalf("the request in flight was cut: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "done /slow" || !resp.Close {
		t.Fatalf("answer %q, close %v: want it whole, with Connection: close", body, resp.Close)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Shutdown did not return once the last request was answered")
	}
}

// A handler that reads the body on another goroutine while it answers (as forward does) gets the
// client's body after a 100 Continue, and its answer is never mixed with that 100 Continue
// (run with -race).
func TestOwnLoopContinuesWhileTheHandlerAnswers(t *testing.T) {
	t.Parallel()
	s := NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := make(chan string, 1)
		go func() {
			b, _ := io.ReadAll(r.Body)
			got <- string(b)
		}()
		if r.URL.Path == "/early" {
			w.WriteHeader(http.StatusAccepted) // the answer's head may go out before the body is asked for
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "got "+<-got)
	}), Limits{}, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = s.Serve(l) }()
	t.Cleanup(func() { _ = s.Close() })
	for range 20 {
		for _, path := range []string{"/late", "/early"} {
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			_, _ = io.WriteString(c, "POST "+path+" HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == http.StatusContinue {
				_, _ = io.WriteString(c, "hello")
				if resp, err = http.ReadResponse(br, nil); err != nil {
					t.Fatal(err)
				}
			} else {
				_, _ = io.WriteString(c, "hello") // answered before continuing: the body comes anyway
			}
			b, err := io.ReadAll(resp.Body)
			c.Close()
			if err != nil || string(b) != "got hello" {
				t.Fatalf("%s: answer %d %q (%v)", path, resp.StatusCode, b, err)
			}
		}
	}
}

// A connection whose answer is out while the rest of its body is still to come (read past to
// keep the connection) does not hold a shutdown up for the body time limit: it is closed as an
// idle one.
func TestOwnLoopShutdownDoesNotWaitForAnUnreadBody(t *testing.T) {
	t.Parallel()
	s := NewH1Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "not read")
	}), Limits{BodyTimeout: 20 * time.Second}, nil)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &readWatchingListener{Listener: raw}
	go func() { _ = s.Serve(l) }()
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	_, _ = io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\nthe beginning")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.Close {
		t.Fatal("the answer closes the connection: nothing is drained")
	}
	// The loop is reading past the rest of the body, which the client never sends.
	for deadline := time.Now().Add(10 * time.Second); !l.reading(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the loop never read past the unread body")
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	began := time.Now()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v after %v", err, time.Since(began))
	}
	if d := time.Since(began); d > time.Second {
		t.Fatalf("Shutdown took %v waiting for a body nobody reads", d)
	}
}

// readWatchingListener's connections tell whether a Read of the server's is blocked on them now.
type readWatchingListener struct {
	net.Listener
	mu    sync.Mutex
	conns []*readWatchingConn
}

func (l *readWatchingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	w := &readWatchingConn{Conn: c}
	l.mu.Lock()
	l.conns = append(l.conns, w)
	l.mu.Unlock()
	return w, nil
}

// reading reports whether the server is in a Read of one of its connections.
func (l *readWatchingListener) reading() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range l.conns {
		if c.inRead.Load() {
			return true
		}
	}
	return false
}

type readWatchingConn struct {
	net.Conn
	inRead atomic.Bool
}

func (c *readWatchingConn) Read(p []byte) (int, error) {
	c.inRead.Store(true)
	defer c.inRead.Store(false)
	return c.Conn.Read(p)
}
