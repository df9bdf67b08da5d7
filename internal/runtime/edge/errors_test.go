package edge_test

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// deadTarget is an incarnation socket nobody listens on any more (its process died).
type deadTarget struct{ addr string }

func (d deadTarget) Addr() string               { return d.addr }
func (d deadTarget) Script() string             { return "secret-script-name" }
func (deadTarget) Incarnation() string          { return "" }
func (deadTarget) Acquire() (edge.Flight, bool) { return noFlight{}, true }

// noFlight is a request nobody counts.
type noFlight struct{}

func (noFlight) Answered() {}
func (noFlight) Done()     {}

type stubResolver map[string]edge.Target

func (s stubResolver) Resolve(host string) (edge.Target, int) {
	t, ok := s[host]
	switch {
	case !ok:
		return nil, edge.UnknownHost
	case t == nil:
		return nil, edge.NotReady
	}
	return t, edge.Found
}

// Every error the edge answers on its own is a problem that names no socket, script or Go error
// (SPEC 5.1): a dead socket (502), a route without a Ready incarnation (503), an unknown host
// (404).
func TestEdgeErrorsNameNothingInternal(t *testing.T) {
	t.Parallel()
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := gone.Addr().String()
	gone.Close()
	_, port, _ := net.SplitHostPort(dead)

	h := edge.New(stubResolver{"dead.test": deadTarget{dead}, "starting.test": nil}, nil, nil, edge.Limits{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(h, edge.Limits{}, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	for host, want := range map[string]struct {
		status int
		code   string
	}{
		"dead.test":     {http.StatusBadGateway, adminapi.CodeUpstreamError},
		"starting.test": {http.StatusServiceUnavailable, adminapi.CodeNotReady},
		"nobody.test":   {http.StatusNotFound, adminapi.CodeUnknownHost},
	} {
		req, err := http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+"/", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, want.status, resp.StatusCode, "%s: %s", host, body)
		require.Equal(t, adminapi.ProblemContentType, resp.Header.Get("Content-Type"))
		var p adminapi.Problem
		require.NoError(t, json.Unmarshal(body, &p))
		require.Equal(t, want.code, p.Code)
		for _, s := range []string{"127.0.0.1", port, "secret-script-name", "dial", "connect", "refused", "tcp", "EOF"} {
			require.NotContains(t, string(body), s, "%s: the error names something internal", host)
		}
	}
}

type liveTarget struct{ addr string }

func (l liveTarget) Addr() string               { return l.addr }
func (liveTarget) Script() string               { return "s" }
func (liveTarget) Incarnation() string          { return "" }
func (liveTarget) Acquire() (edge.Flight, bool) { return noFlight{}, true }

// A worker's answer headers are bounded (1 MiB): a worker cannot make the edge hold an endless
// header in memory; it gets a 502 instead. (workerd stands in for no worker here: it cannot be
// made to send such an answer, so a socket that answers like a hostile one does.)
func TestEdgeBoundsAWorkersAnswerHeaders(t *testing.T) {
	t.Parallel()
	upstream, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { upstream.Close() })
	go func() {
		for {
			c, err := upstream.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				n, _ := c.Read(buf)
				size := 512 << 10
				if strings.Contains(string(buf[:n]), "GET /huge") {
					size = 2 << 20
				}
				_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Big: "+strings.Repeat("b", size)+"\r\n\r\nok")
			}()
		}
	}()
	h := edge.New(stubResolver{"w.test": liveTarget{upstream.Addr().String()}}, nil, nil, edge.Limits{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(h, edge.Limits{}, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })

	for path, want := range map[string]int{"/fine": http.StatusOK, "/huge": http.StatusBadGateway} {
		req, err := http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+path, nil)
		require.NoError(t, err)
		req.Host = "w.test"
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, path)
	}
}

// countedTarget is a worker's socket whose requests are counted: how many ended withdrawn (never
// sent to the worker) and how many ended at all.
type countedTarget struct {
	deadTarget
	withdrawn, done *atomic.Int32
}

func (c countedTarget) Acquire() (edge.Flight, bool) { return &countedFlight{c: c}, true }

type countedFlight struct {
	c    countedTarget
	over bool
}

func (*countedFlight) Answered() {}
func (f *countedFlight) Withdraw() {
	f.c.withdrawn.Add(1)
	f.Done()
}
func (f *countedFlight) Done() {
	if !f.over {
		f.over = true
		f.c.done.Add(1)
	}
}

// A request refused before it is sent (its declared body is over the limit), or that found its
// worker's socket gone, is withdrawn: it never reached its worker, and a kill of the worker's
// process must not blame the worker for it.
func TestARequestRefusedBeforeItIsSentIsWithdrawn(t *testing.T) {
	t.Parallel()
	var withdrawn, done atomic.Int32
	h := edge.New(stubResolver{"w.test": countedTarget{deadTarget{"127.0.0.1:1"}, &withdrawn, &done}}, nil, nil, edge.Limits{MaxBodyBytes: 8})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := edge.NewH1Server(h, edge.Limits{MaxBodyBytes: 8}, nil)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	req, err := http.NewRequest(http.MethodPost, "http://"+l.Addr().String()+"/", strings.NewReader(strings.Repeat("x", 64)))
	require.NoError(t, err)
	req.Host = "w.test"
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
	require.Eventually(t, func() bool { return done.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, withdrawn.Load())

	req, err = http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+"/", nil)
	require.NoError(t, err)
	req.Host = "w.test"
	resp, err = (&http.Client{Timeout: 10 * time.Second}).Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadGateway, resp.StatusCode)
	require.Eventually(t, func() bool { return done.Load() == 2 }, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 2, withdrawn.Load())
}
