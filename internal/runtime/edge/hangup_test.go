package edge_test

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// lockedBuffer is a log's destination read while the edge writes to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A client that hangs up while a slow worker works ends the worker's request with it: the edge's
// connection to the worker is closed within a second (not at the 30 s response limit), and
// nothing is logged at WARN for it (the client left; the worker did nothing wrong). Whether the
// request had no body or a body read whole, and whether the client closed or reset. (A socket
// that reads the request and never answers stands in for the slow worker: workerd's side cannot
// be watched for the moment its request ends.)
func TestEdgeEndsTheWorkersRequestWhenTheClientHangsUp(t *testing.T) {
	t.Parallel()
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { upstream.Close() })
	ended := make(chan time.Time, 8)
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(io.Discard, c) // until the edge closes its side
				ended <- time.Now()
			}()
		}
	}()
	var logged lockedBuffer
	h := edge.New(stubResolver{"slow.test": liveTarget{upstream.Addr().String()}}, nil,
		slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})), edge.Limits{})
	srv := edge.NewH1Server(h, edge.Limits{}, nil)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	for _, tc := range []struct {
		name, raw string
		reset     bool
	}{
		{"no body", "GET /slow HTTP/1.1\r\nHost: slow.test\r\n\r\n", false},
		{"a body read whole", "POST /slow HTTP/1.1\r\nHost: slow.test\r\nContent-Length: 5\r\n\r\nhello", false},
		{"a chunked body, reset", "POST /slow HTTP/1.1\r\nHost: slow.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", true},
	} {
		c, err := net.Dial("tcp", l.Addr().String())
		require.NoError(t, err)
		_, err = io.WriteString(c, tc.raw)
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond) // the request is at the worker, which does not answer
		select {
		case <-ended:
			t.Fatalf("%s: the worker's request ended before the client left", tc.name)
		default:
		}
		if tc.reset {
			require.NoError(t, c.(*net.TCPConn).SetLinger(0))
		}
		left := time.Now()
		c.Close()
		select {
		case at := <-ended:
			require.Less(t, at.Sub(left), time.Second, tc.name)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: the worker's request went on after the client left", tc.name)
		}
	}
	time.Sleep(100 * time.Millisecond) // anything the edge logs for the last one
	require.NotContains(t, logged.String(), "level=WARN", "a client leaving was logged as the worker's fault")
}
