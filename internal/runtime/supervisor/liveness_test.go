package supervisor

import (
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// countingWorker counts the requests its fetch handler ran; /loop never returns.
const countingWorker = `let served = 0;
export default {
  async fetch(req) {
    served++;
    if (new URL(req.url).pathname === "/loop") { while (true) {} }
    return new Response("served=" + served + "\n");
  }
};`

func TestProbesNeverRunTheUserWorker(t *testing.T) {
	t.Parallel()
	opts := options(t)
	opts.LivenessPeriod = 20 * time.Millisecond
	inc, err := Start(spec(t, countingWorker, nil), opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	// Many liveness periods: every one of them probes.
	time.Sleep(50 * opts.LivenessPeriod)
	require.True(t, inc.Ready())
	require.Equal(t, "served=1\n", get(t, inc.Addr()), "readiness and liveness probes reached the user's fetch handler")
}

func TestFailedStartSaysWhatWorkerdSaid(t *testing.T) {
	t.Parallel()
	inc, err := Start(spec(t, "export default { fetch() { return new Response('x') } };\nthrow new Error('boom at the top level');", nil), options(t))
	require.NoError(t, err)
	select {
	case <-inc.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a candidate that cannot start must fail")
	}
	s := inc.Status()
	require.Equal(t, adminapi.StateFailed, s.State)
	require.Contains(t, s.Message, "Uncaught Error: boom at the top level", "the deploy failure carries workerd's own error")
	require.Contains(t, s.Message, "at main.js:2", "and where it was thrown")
}

func TestDiagnosisPicksTheErrorOverTheLastLine(t *testing.T) {
	t.Parallel()
	w := &tailWriter{log: discard(), scrub: scrubForms([]string{"hunter2"})}
	_, _ = w.Write([]byte("workerd starting\nservice main: Uncaught SyntaxError: Unexpected token 'hunter2'\n  at module-000.js:3\n  at module-000.js:1\nsome unrelated trailer\n"))
	d := w.Diagnosis()
	require.Equal(t, "service main: Uncaught SyntaxError: Unexpected token '[redacted]' / at module-000.js:3 / at module-000.js:1", d)
	w2 := &tailWriter{log: discard()}
	_, _ = w2.Write([]byte("one\ntwo\n"))
	require.Equal(t, "two", w2.Diagnosis(), "without an error line, the last line")
}

func discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

func TestLoopingWorkerIsKilledAndRestarted(t *testing.T) {
	t.Parallel()
	opts := options(t)
	// Shortened timings: 3 misses of 300 ms probes every 500 ms (the defaults are 5 s and 2 s).
	opts.LivenessPeriod, opts.LivenessTimeout = 500*time.Millisecond, 300*time.Millisecond
	sp := spec(t, countingWorker, nil)
	sp.Admitted = true
	inc, err := Start(sp, opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	first := inc.Status().PID

	stuck := make(chan error, 1)
	began := time.Now()
	go func() {
		resp, err := (&http.Client{}).Get("http://" + inc.Addr() + "/loop") // no client timeout
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		stuck <- err
	}()
	waitFor(t, "not Ready", func() bool { return !inc.Ready() })
	notReadyAfter := time.Since(began)
	// One period to the first probe, then LivenessMisses probes each of which times out.
	require.Less(t, notReadyAfter, opts.LivenessPeriod*(LivenessMisses+1)+opts.LivenessTimeout+time.Second)
	select {
	case err := <-stuck:
		require.Error(t, err, "the request stuck on the looping worker ends with its process")
	case <-time.After(10 * time.Second):
		t.Fatal("the request stuck on the looping worker still hangs")
	}
	waitFor(t, "restarted", func() bool { s := inc.Status(); return s.State == adminapi.StateReady && s.PID != first })
	s := inc.Status()
	require.Equal(t, 1, s.Restarts, "the kill counts as a restart (toward an incident)")
	require.Equal(t, "served=1\n", get(t, inc.Addr()), "the same incarnation, started afresh")
	t.Logf("a looping worker read not Ready %s after its request began", notReadyAfter.Round(time.Millisecond))
}

func TestUnresponsiveIsTheReasonWhileItRestarts(t *testing.T) {
	t.Parallel()
	opts := options(t)
	opts.LivenessPeriod, opts.LivenessTimeout = 200*time.Millisecond, 200*time.Millisecond
	opts.Backoff, opts.MaxBackoff = 3*time.Second, 3*time.Second // long enough to read the status
	sp := spec(t, countingWorker, nil)
	sp.Admitted = true
	inc, err := Start(sp, opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	go func() {
		if resp, err := http.Get("http://" + inc.Addr() + "/loop"); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "restarting", func() bool { s := inc.Status(); return s.PID == 0 && s.State == adminapi.StatePending })
	s := inc.Status()
	require.Equal(t, adminapi.ReasonUnresponsive, s.Reason)
	require.True(t, strings.Contains(s.Message, "missed 3 liveness probes"), s.Message)
}
