package supervisor

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

const secretWorker = `export default {
  async fetch(req, env) {
    const s = env.TOKEN ?? "";
    return new Response("len=" + s.length + "\n");
  }
};`

func spec(t *testing.T, source string, env []string) Spec {
	t.Helper()
	files, err := workerd.Render(workerd.Worker{
		Modules: map[string]string{"main.js": source}, MainModule: "main.js", CompatibilityDate: "2024-09-23", Secrets: []string{"TOKEN"},
	}, ConfigFile, ConfigConst, SocketName)
	require.NoError(t, err)
	base := filepath.Join(t.TempDir(), "incarnations")
	require.NoError(t, safedir.Ensure(base, safedir.Current()))
	return Spec{ID: "inc-test", Script: "s", Dir: filepath.Join(base, "inc-test"), Files: files, Env: env}
}

func options(t *testing.T) Options {
	return Options{Workerd: workerdtest.Binary(t), Backoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, ProbeDeadline: 10 * time.Second, StopGrace: 2 * time.Second}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 20*time.Second, 20*time.Millisecond, what)
}

func get(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}

func TestIncarnationIsReadyRestartsAsItselfAndCleansUp(t *testing.T) {
	t.Parallel()
	sp := spec(t, secretWorker, []string{workerd.SecretEnv("TOKEN") + "=hunter2"})
	sp.Admitted = true
	inc, err := Start(sp, options(t))
	require.NoError(t, err)
	waitFor(t, "ready", inc.Ready)
	require.Equal(t, "len=7\n", get(t, inc.Addr()))
	info, err := os.Stat(filepath.Join(sp.Dir, ConfigFile))
	require.NoError(t, err)
	require.Equal(t, safedir.FileMode, info.Mode().Perm())

	first := inc.Status().PID
	require.NoError(t, syscall.Kill(first, syscall.SIGKILL))
	waitFor(t, "restarted", func() bool { s := inc.Status(); return s.State == adminapi.StateReady && s.PID != first })
	require.Equal(t, 1, inc.Status().Restarts)
	require.Equal(t, "len=7\n", get(t, inc.Addr()), "the same socket, the same environment")

	inc.Stop()
	_, err = os.Stat(sp.Dir)
	require.ErrorIs(t, err, os.ErrNotExist, "the private directory goes with the incarnation")
	require.Error(t, syscall.Kill(first, 0))
}

func TestCandidateThatCannotStartFails(t *testing.T) {
	t.Parallel()
	sp := spec(t, "export default { fetch( {", nil)
	inc, err := Start(sp, options(t))
	require.NoError(t, err)
	select {
	case <-inc.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a candidate that cannot start must fail")
	}
	s := inc.Status()
	require.Equal(t, adminapi.StateFailed, s.State)
	require.Equal(t, adminapi.ReasonFailed, s.Reason)
	require.Contains(t, s.Message, "never became ready")
	_, err = os.Stat(sp.Dir)
	require.ErrorIs(t, err, os.ErrNotExist)
}

func TestBrakeHoldsRestartOfAdmittedIncarnation(t *testing.T) {
	t.Parallel()
	var braked atomicBool
	braked.set(true)
	sp := spec(t, secretWorker, nil)
	sp.Admitted = true
	sp.Braked = braked.get
	inc, err := Start(sp, options(t))
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "ready", inc.Ready)
	require.NoError(t, syscall.Kill(inc.Status().PID, syscall.SIGKILL))
	waitFor(t, "held", func() bool { return inc.Status().Reason == adminapi.ReasonBraked })
	// The brake is re-checked every second and the backoff is at most 200 ms here: over 2.5 s a
	// brake that let go would show as a process or another reason.
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		st := inc.Status()
		require.Equal(t, adminapi.ReasonBraked, st.Reason, "restarted under the brake")
		require.Zero(t, st.PID, "restarted under the brake")
	}
	braked.set(false)
	inc.Wake()
	waitFor(t, "back", inc.Ready)
}

// Each restart is a change of the status that watchers are told of, also when the process failed
// to start exactly as the time before (the same message, no PID): its count moved.
func TestEveryRestartIsAChangeWatchersAreToldOf(t *testing.T) {
	t.Parallel()
	sp := spec(t, secretWorker, nil)
	sp.Admitted = true
	opts := options(t)
	opts.Workerd = filepath.Join(t.TempDir(), "no-workerd-here")
	opts.Backoff, opts.MaxBackoff = 10*time.Millisecond, 10*time.Millisecond
	told := make(chan int, 1000)
	opts.Changed = func(i *Incarnation) {
		select {
		case told <- i.Status().Restarts:
		default:
		}
	}
	inc, err := Start(sp, opts)
	require.NoError(t, err)
	defer inc.Stop()
	waitFor(t, "five restarts", func() bool { return inc.Status().Restarts >= 5 })
	seen := map[int]bool{}
	for len(told) > 0 {
		seen[<-told] = true
	}
	for n := 1; n <= 4; n++ {
		require.True(t, seen[n], "restart %d changed nothing a watcher was told of (told of %v)", n, seen)
	}
}
