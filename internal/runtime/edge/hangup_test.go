package edge_test

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	arrived, ended := make(chan struct{}, 8), make(chan time.Time, 8)
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				if _, err := c.Read(make([]byte, 1)); err == nil {
					arrived <- struct{}{}
				}
				_, _ = io.Copy(io.Discard, c) // until the edge closes its side
				ended <- time.Now()
			}()
		}
	}()
	var logged lockedBuffer
	reg := prometheus.NewRegistry()
	h := edge.New(stubResolver{"slow.test": liveTarget{upstream.Addr().String()}}, reg,
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
		select {
		case <-arrived: // the request is at the worker, which does not answer
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the request never reached the worker", tc.name)
		}
		select {
		case <-ended:
			t.Fatalf("%s: the worker's request ended before the client left", tc.name)
		case <-time.After(100 * time.Millisecond): // a moment for an early end to show
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
	// The edge counts a request once its handler is done, logging included.
	require.Eventually(t, func() bool { return edgeRequests(reg) == 3 }, 10*time.Second, 5*time.Millisecond, "the edge finished the three requests")
	require.NotContains(t, logged.String(), "level=WARN", "a client leaving was logged as the worker's fault")
}

// edgeRequests is the number of requests the edge has finished, by its requests counter.
func edgeRequests(reg *prometheus.Registry) int {
	families, err := reg.Gather()
	if err != nil {
		return -1
	}
	n := 0
	for _, f := range families {
		if f.GetName() != "takoform_runtime_edge_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			n += int(m.GetCounter().GetValue())
		}
	}
	return n
}
