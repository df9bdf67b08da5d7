package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// warnings records what a client says while the Host does not answer.
type warnings struct {
	mu  sync.Mutex
	at  []time.Time
	msg []string
}

func (w *warnings) log(_ context.Context, msg string, fields map[string]any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.at = append(w.at, time.Now())
	w.msg = append(w.msg, fmt.Sprint(msg, fields))
}

func (w *warnings) snapshot() ([]time.Time, []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]time.Time(nil), w.at...), append([]string(nil), w.msg...)
}

// refusingAddress is a loopback address on which nothing listens: a stopped Host.
func refusingAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// blackhole accepts connections, reads what comes and never answers: a Host that hangs.
func blackhole(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns sync.WaitGroup
	t.Cleanup(func() { _ = l.Close(); conns.Wait() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				defer conn.Close()
				buf := make([]byte, 4096)
				for {
					if _, err := conn.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

const bound = 2 * time.Second

// ownedPut is a create under a resource timeout far beyond the unreachable bound.
func ownedPut(t *testing.T, c *Client) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := c.Do(ctx, Request{Method: http.MethodPut, Path: "/v1/spaces/s/workers/w", Body: map[string]string{}, OwnershipToken: "token-0123456789abcdef"}, nil)
	return time.Since(start), err
}

func TestAStoppedHostFailsAMutationWithinTheBoundAndWarnsMeanwhile(t *testing.T) {
	t.Parallel()
	addr := refusingAddress(t)
	var w warnings
	c, err := New(Config{Endpoint: "http://operator:hunter2@" + addr, APIKey: "tkf_secret_value", Timeout: 30 * time.Second,
		Unreachable: bound, EndpointFrom: "TAKOFORM_ENDPOINT", Warn: w.log})
	require.NoError(t, err)
	took, err := ownedPut(t, c)

	var unreachable *UnreachableError
	require.ErrorAs(t, err, &unreachable, "%v", err)
	var unknown *OutcomeUnknownError
	require.False(t, errors.As(err, &unknown), "a refused connection sent nothing, so the outcome is known: %v", err)
	require.Less(t, took, bound+time.Second, "the failure comes at the bound, not at the resource's one-minute timeout")
	require.GreaterOrEqual(t, took, bound-WarnInterval(bound), "the Host is retried until about the bound")
	require.Contains(t, err.Error(), "TAKOFORM_ENDPOINT")
	require.Contains(t, err.Error(), "http://operator:xxxxx@"+addr)
	require.Contains(t, err.Error(), "connection refused", "the cause is the refusal, not the last try cut at the bound")

	at, msgs := w.snapshot()
	require.GreaterOrEqual(t, len(at), 3, "a warning every %s: %q", WarnInterval(bound), msgs)
	for _, m := range msgs {
		require.Contains(t, m, "has not answered")
		require.Contains(t, m, "TAKOFORM_ENDPOINT")
		require.NotContains(t, m, "hunter2")
		require.NotContains(t, m, "tkf_secret_value")
	}
	require.NotContains(t, err.Error(), "hunter2")
	require.NotContains(t, err.Error(), "tkf_secret_value")
	for i := 1; i < len(at); i++ {
		require.Less(t, at[i].Sub(at[i-1]), WarnInterval(bound)+250*time.Millisecond, "no gap longer than the interval")
	}
	time.Sleep(WarnInterval(bound) + 100*time.Millisecond)
	after, _ := w.snapshot()
	require.Len(t, after, len(at), "the warnings stop with the request")
}

func TestAHangingHostIsBoundedLikeAStoppedOne(t *testing.T) {
	t.Parallel()
	var w warnings
	c, err := New(Config{Endpoint: "http://" + blackhole(t), APIKey: "k", Timeout: 30 * time.Second, Unreachable: bound, Warn: w.log})
	require.NoError(t, err)
	start := time.Now()
	_, err = c.GetWorker(context.Background(), "s", "w")
	took := time.Since(start)
	var unreachable *UnreachableError
	require.ErrorAs(t, err, &unreachable, "%v", err)
	require.Less(t, took, bound+time.Second, "the 30 s request timeout does not stretch the bound")
	at, msgs := w.snapshot()
	require.GreaterOrEqual(t, len(at), 3, "warnings come during the one hanging attempt too: %q", msgs)
}

// TestRuleASentMutationIsBoundedOnlyByItsResourceTimeout (SPEC 4): a create that reached a Host
// that does not answer may have landed, so unreachable_timeout alone never makes its outcome
// unknown. It is sent again with its token until the resource's timeout; a Host that answers
// after the bound (here three times the bound) completes it, and the warnings say it is replayed.
func TestRuleASentMutationIsBoundedOnlyByItsResourceTimeout(t *testing.T) {
	t.Parallel()
	back := make(chan struct{})
	var tries atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		select {
		case <-back:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{}`))
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	time.AfterFunc(3*bound, func() { close(back) })
	var w warnings
	c, err := New(Config{Endpoint: srv.URL, APIKey: "k", Timeout: 30 * time.Second, Unreachable: bound, Warn: w.log})
	require.NoError(t, err)
	took, err := ownedPut(t, c)
	require.NoError(t, err, "answered after the bound, within the resource's timeout")
	require.Greater(t, took, 3*bound-100*time.Millisecond)
	require.Greater(t, tries.Load(), int64(2), "asked again while the Host was silent")
	_, msgs := w.snapshot()
	require.Contains(t, strings.Join(msgs, "\n"), "sent again with its ownership token")
}

// A create whose resource timeout ends while its request hangs at the Host (shorter than the
// unreachable bound) may have landed: its outcome is unknown, as at the bound, never a bare
// deadline error the provider would take for a create that never happened.
func TestAResourceTimeoutEndingMidRequestLeavesTheOutcomeUnknown(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Endpoint: "http://" + blackhole(t), APIKey: "k", Timeout: 30 * time.Second, Unreachable: time.Minute})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_, err = c.Do(ctx, Request{Method: http.MethodPut, Path: "/v1/spaces/s/workers/w", Body: map[string]string{}, OwnershipToken: "token-0123456789abcdef"}, nil)
	var unknown *OutcomeUnknownError
	require.ErrorAs(t, err, &unknown, "%v", err)
	require.Contains(t, err.Error(), "outcome is unknown")
}

func TestAReadOfAStoppedHostNamesTheEndpoint(t *testing.T) {
	t.Parallel()
	addr := refusingAddress(t)
	c, err := New(Config{Endpoint: "http://" + addr, APIKey: "k", MaxRetries: 1, Unreachable: 2 * time.Second, EndpointFrom: "the provider's endpoint attribute"})
	require.NoError(t, err)
	_, err = c.GetWorker(context.Background(), "s", "w")
	var unreachable *UnreachableError
	require.ErrorAs(t, err, &unreachable, "%v", err)
	require.Contains(t, err.Error(), "the provider's endpoint attribute")
}

func TestAHostBackWithinTheBoundIsNotAnError(t *testing.T) {
	t.Parallel()
	// One listener holds the address throughout: it resets connections while the Host is away
	// (1.5 s, within the 4 s bound) and then serves them, so no other process can take the port.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	away := newAwayListener(l, 1500*time.Millisecond)
	var w warnings
	c, err := New(Config{Endpoint: "http://" + l.Addr().String(), APIKey: "k", Unreachable: 4 * time.Second, Warn: w.log})
	require.NoError(t, err)
	srv := &http.Server{Handler: &flaky{statuses: []int{200}}, ReadHeaderTimeout: time.Second}
	t.Cleanup(func() { _ = srv.Close() })
	go func() { _ = srv.Serve(away) }()
	took, err := ownedPut(t, c)
	require.Positive(t, away.reset.Load(), "the client met the Host away")
	require.NoError(t, err)
	require.Greater(t, took, time.Second)
	at, _ := w.snapshot()
	require.NotEmpty(t, at, "it warned while the Host was away")
	time.Sleep(WarnInterval(4*time.Second) + 200*time.Millisecond)
	after, _ := w.snapshot()
	require.Len(t, after, len(at), "and stopped once it answered")
}

// awayListener resets every connection for its first d (a Host that is down), then hands them to
// Accept: the address stays held across the restart.
type awayListener struct {
	net.Listener
	reset   atomic.Int64
	accepts chan net.Conn
}

func newAwayListener(l net.Listener, d time.Duration) *awayListener {
	a := &awayListener{Listener: l, accepts: make(chan net.Conn)}
	back := time.Now().Add(d)
	go func() {
		defer close(a.accepts)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			if time.Now().Before(back) {
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0)
				}
				_ = conn.Close()
				a.reset.Add(1)
				continue
			}
			a.accepts <- conn
		}
	}()
	return a
}

func (a *awayListener) Accept() (net.Conn, error) {
	conn, ok := <-a.accepts
	if !ok {
		return nil, net.ErrClosed
	}
	return conn, nil
}

// TestAHostBusyPastHalfTheBoundIsAskedAgainNotGivenUp: a deploy can keep one call busy past the
// unreachable bound; the try is cut at half the bound and the replay is answered (here at once),
// so a Host that is working is never reported silent.
func TestAHostBusyPastHalfTheBoundIsAskedAgainNotGivenUp(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			<-release // the first call stays busy past the whole bound
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	c, err := New(Config{Endpoint: "http://" + l.Addr().String(), APIKey: "k", Timeout: 30 * time.Second, Unreachable: bound})
	require.NoError(t, err)
	took, err := ownedPut(t, c)
	require.NoError(t, err, "the Host answered the replay")
	require.Less(t, took, bound, "asked again within the bound")
	require.EqualValues(t, 2, calls.Load())
}

// A read of a Host that does not answer is tried again for the whole unreachable bound, however
// few retries max_retries allows, so that raising unreachable_timeout holds for reads and plans
// too (SPEC 4): max_retries bounds answers that ask for a retry, not silence.
func TestAReadOfASilentHostWaitsOutTheUnreachableBound(t *testing.T) {
	t.Parallel()
	for name, addr := range map[string]string{"stopped": refusingAddress(t), "hanging": blackhole(t)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c, err := New(Config{Endpoint: "http://" + addr, APIKey: "k", MaxRetries: 1, Unreachable: 3 * time.Second})
			require.NoError(t, err)
			start := time.Now()
			_, err = c.GetWorker(context.Background(), "s", "w")
			took := time.Since(start)
			var unreachable *UnreachableError
			require.ErrorAs(t, err, &unreachable, "%v", err)
			require.GreaterOrEqual(t, took, 2500*time.Millisecond, "the read gave up before the bound")
			require.Less(t, took, 10*time.Second)
		})
	}
}
