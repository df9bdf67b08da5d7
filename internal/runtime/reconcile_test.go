package runtime_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// TestOnlyAReadyCandidateTakesTheRouteAndTheIncumbentLeavesOnlyThen: the reconciler's rule for
// updates (SPEC 5, continuity), without workerd. A candidate that is placed but not Ready, or that
// failed, never takes the route from the serving incarnation, which keeps answering every request
// and keeps running; once a candidate is Ready the edge switches to it, and only then does the
// incumbent leave its process.
func TestOnlyAReadyCandidateTakesTheRouteAndTheIncumbentLeavesOnlyThen(t *testing.T) {
	t.Parallel()
	f, procs := setupWithoutWorkerd(t)
	const host = "app.workers.localhost"
	f.script("app", "uid-a", 1, "v1")
	f.route(host, "app", "ep-a")
	first := f.waitReady("app").Incarnation.ID
	f.answers(host, "app "+first)

	// Placed, never Ready: the incumbent serves and stays.
	procs.Hold("app")
	f.script("app", "uid-a", 2, "v2")
	held := f.waitStatus("a candidate placed", func(s adminapi.ScriptStatus) bool { return s.Candidate != nil }, "app")
	require.False(t, held.Ready, "the desired deployment is not the one serving")
	require.Equal(t, first, held.Incarnation.ID)
	second := held.Candidate.ID
	require.NotEqual(t, first, second)
	f.holds("the incumbent answers while its successor is not Ready", 300*time.Millisecond, func() error {
		code, body, _ := f.h.Get(t, host, "/")
		if code != http.StatusOK || body != "app "+first {
			return fmt.Errorf("answered %d %q", code, body)
		}
		if live := procs.Live("app"); len(live) != 2 {
			return fmt.Errorf("live incarnations %v, want the incumbent and its candidate", live)
		}
		return nil
	})

	// Ready: the edge switches, then the incumbent leaves.
	procs.Clear("app")
	f.answers(host, "app "+second)
	require.Eventually(t, func() bool { return fmt.Sprint(procs.Live("app")) == fmt.Sprint([]string{second}) }, 10*time.Second, 10*time.Millisecond,
		"the incumbent left once its successor served: %v", procs.Live("app"))
	require.True(t, f.waitReady("app").Ready)

	// Failed: it stays failed, the serving one serves, until the Host asks again.
	procs.Fail("app", "does not load")
	f.script("app", "uid-a", 3, "v3")
	failed := f.waitStatus("a failed candidate", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.State == adminapi.StateFailed
	}, "app")
	require.Equal(t, second, failed.Incarnation.ID)
	require.Equal(t, "does not load", failed.Candidate.Message)
	f.holds("the serving incarnation answers beside a failed candidate", 200*time.Millisecond, func() error {
		if code, body, _ := f.h.Get(t, host, "/"); code != http.StatusOK || body != "app "+second {
			return fmt.Errorf("answered %d %q", code, body)
		}
		return nil
	})
	procs.Clear("app")
	f.script("app", "uid-a", 4, "v4")
	fourth := f.waitStatus("generation 4 serving", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 4
	}, "app").Incarnation.ID
	f.answers(host, "app "+fourth)
}
