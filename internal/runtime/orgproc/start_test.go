package orgproc

import (
	"net/http"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// standIn is a workerd stand-in for a process's start: a real child (so a kill has a pid to end)
// whose CPU share changes are recorded.
type standIn struct {
	cmd *exec.Cmd

	mu      sync.Mutex
	stalled []stallChange
}

type stallChange struct {
	stalled bool
	at      time.Time
}

func (s *standIn) Pid() int         { return s.cmd.Process.Pid }
func (s *standIn) Wait() error      { return s.cmd.Wait() }
func (s *standIn) LimitHit() string { return "" }
func (s *standIn) SetHeld(bool) error {
	return nil
}

func (s *standIn) SetStalled(stalled bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stalled = append(s.stalled, stallChange{stalled: stalled, at: time.Now()})
	return nil
}

func (s *standIn) changes() []stallChange {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]stallChange(nil), s.stalled...)
}

// A start at the least CPU weight (its organization a suspect) that has not answered a third of
// the way to its deadline gets its organization's weight back, once, and is still killed at the
// deadline; one that answers before then keeps the least weight, and one that did not start at it
// is never changed.
func TestAStalledStartThatHasNotAnsweredGetsItsWeightBackAThirdOfTheWayToItsDeadline(t *testing.T) {
	t.Parallel()
	const deadline = 900 * time.Millisecond
	m, err := New(Options{SocketsDir: t.TempDir(), ChannelsDir: t.TempDir(), StartDeadline: deadline})
	require.NoError(t, err)
	start := func(t *testing.T, stalled bool) (*Process, *standIn, chan error) {
		p, err := newProcess(m, procKey{org: "org"}, 1, 0)
		require.NoError(t, err)
		t.Cleanup(func() { p.sock.close(p) })
		p.startedStalled = stalled
		cmd := exec.Command("sleep", "60")
		require.NoError(t, cmd.Start())
		proc := &standIn{cmd: cmd}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		return p, proc, exited
	}

	t.Run("it does not answer", func(t *testing.T) {
		t.Parallel()
		p, proc, exited := start(t, true)
		began := time.Now()
		out := p.awaitFirstAnswer(exited, proc)
		require.NotNil(t, out)
		require.Contains(t, out.why, "did not answer within")
		require.GreaterOrEqual(t, time.Since(began), deadline)
		changes := proc.changes()
		require.Len(t, changes, 1, "lifted once")
		require.False(t, changes[0].stalled)
		require.GreaterOrEqual(t, changes[0].at.Sub(began), deadline/3)
		require.Less(t, changes[0].at.Sub(began), deadline)
		require.False(t, p.startedStalled)
	})
	t.Run("it answers before a third of its deadline", func(t *testing.T) {
		t.Parallel()
		p, proc, exited := start(t, true)
		go func() {
			_ = http.Serve(p.sock.ingress, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("alive")) }))
		}()
		require.Nil(t, p.awaitFirstAnswer(exited, proc))
		time.Sleep(deadline / 2)
		require.Empty(t, proc.changes())
		require.True(t, p.startedStalled)
		p.kill(exited, proc)
	})
	t.Run("it did not start stalled", func(t *testing.T) {
		t.Parallel()
		p, proc, exited := start(t, false)
		require.NotNil(t, p.awaitFirstAnswer(exited, proc))
		require.Empty(t, proc.changes())
	})
}
