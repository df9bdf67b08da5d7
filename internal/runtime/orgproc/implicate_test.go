package orgproc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An incarnation runs alone after QuarantineImplications implications within QuarantineWindow,
// and the implication that makes IncidentImplications within IncidentWindow opens an incident,
// said once (the operator's log line); older implications fall out of the count.
func TestImplicationsQuarantineAndOpenAnIncidentOnce(t *testing.T) {
	t.Parallel()
	var inc Incarnation
	start := time.Now()
	opened := 0
	for n := 1; n <= IncidentImplications+2; n++ {
		alone, incident := inc.implicate(start.Add(time.Duration(n) * time.Minute))
		require.Equal(t, n >= QuarantineImplications, alone, "implication %d", n)
		if incident {
			opened++
			require.Equal(t, IncidentImplications, n)
		}
	}
	require.Equal(t, 1, opened, "the incident is opened once")
	// Past the window, the count starts again.
	_, incident := inc.implicate(start.Add(IncidentWindow + time.Hour))
	require.False(t, incident)
}

// A liveness kill implicates the requests in flight across a moment the thread was free (begun
// before the process's last answer), and the first one to begin after it when none of those came
// since the last answered probe; never the requests that came after while the thread was held
// (SPEC 5.1). An abort implicates every request in flight, a load in progress its incarnation.
func TestAKillBlamesTheRequestThatTookTheThreadNotThoseQueuedBehindIt(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return at.Add(time.Duration(n) * time.Millisecond) }
	looper, sibling, calm := &unit{loaderID: "looper"}, &unit{loaderID: "sibling"}, &unit{loaderID: "calm"}
	names := func(cs []candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.u.loaderID)
		}
		return out
	}
	// The last probe answered at 0 ms, the last response at 40 ms.
	probe, answer := ms(0), ms(40)
	for _, tc := range []struct {
		name       string
		candidates []candidate
		killed     bool
		want       []string
	}{{
		name: "the loop began on a free thread; a sibling's requests queued behind it",
		candidates: []candidate{
			{u: sibling, began: []time.Time{ms(70), ms(900)}},
			{u: looper, began: []time.Time{ms(50)}},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "the loop waited behind the last response, then took the thread",
		candidates: []candidate{
			{u: looper, began: []time.Time{ms(30)}},
			{u: sibling, began: []time.Time{ms(60)}},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a request held since before the last probe may have looped after its wait; so may the first after the last answer",
		candidates: []candidate{
			{u: calm, began: []time.Time{ms(-5000)}},
			{u: sibling, began: []time.Time{ms(300)}},
			{u: looper, began: []time.Time{ms(200)}},
		},
		killed: true, want: []string{"calm", "looper"},
	}, {
		name: "a load in progress holds the thread itself",
		candidates: []candidate{
			{u: looper, loading: true},
			{u: sibling, began: []time.Time{ms(50)}},
		},
		killed: true, want: []string{"looper"},
	}, {
		name:       "an abort implicates every request in flight",
		candidates: []candidate{{u: sibling, began: []time.Time{ms(900)}}, {u: calm}, {u: looper, began: []time.Time{ms(50)}}},
		killed:     false, want: []string{"sibling", "looper"},
	}, {
		name:       "nothing in flight",
		candidates: []candidate{{u: sibling}, {u: looper}},
		killed:     true, want: nil,
	}} {
		require.Equal(t, tc.want, names(blame(tc.candidates, tc.killed, probe, answer)), tc.name)
	}
}
