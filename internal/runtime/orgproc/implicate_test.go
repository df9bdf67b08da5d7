package orgproc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
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
// before the process's last answer), or when there is none the first to begin after it; never the
// requests that came later while the thread was held (SPEC 5.1). Requests whose answer began, and
// those that may be waiting for their worker's subrequests, only when nothing else is. The calls
// of an implicated worker are implicated with it, and judged only by it. An abort implicates every
// request in flight, a load in progress its incarnation.
func TestAKillBlamesTheRequestThatTookTheThreadNotThoseQueuedBehindIt(t *testing.T) {
	t.Parallel()
	ms := func(n int) int64 { return int64(time.Duration(n) * time.Millisecond) }
	worker := func(script string) *unit { return &unit{inc: &Incarnation{spec: Spec{Script: script}}} }
	looper, sibling, calm, callee := worker("looper"), worker("sibling"), worker("calm"), worker("callee")
	at := func(ns ...int) []begun {
		var out []begun
		for _, n := range ns {
			out = append(out, begun{at: ms(n), open: true})
		}
		return out
	}
	// waitingFor are subrequests begun at each time whose answers have not come.
	waitingFor := func(ns ...int) []subrequest {
		var out []subrequest
		for _, n := range ns {
			out = append(out, subrequest{began: ms(n), sent: ms(n)})
		}
		return out
	}
	names := func(cs []candidate) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.u.inc.spec.Script)
		}
		return out
	}
	// The last answer (a probe's or a response's) at 1,000 ms.
	answer := ms(1000)
	for _, tc := range []struct {
		name       string
		candidates []candidate
		killed     bool
		want       []string
	}{{
		name:       "the loop began on a free thread; a sibling's requests queued behind it",
		candidates: []candidate{{u: sibling, flights: at(1020, 1900)}, {u: looper, flights: at(1010)}},
		killed:     true, want: []string{"looper"},
	}, {
		name:       "the loop waited behind the last response, then took the thread",
		candidates: []candidate{{u: looper, flights: at(998)}, {u: sibling, flights: at(1020)}},
		killed:     true, want: []string{"looper"},
	}, {
		// Wrong when the loop is the looper's, who is blamed once calm runs alone (SPEC 5.1's
		// own rule: a request in flight across an answered probe).
		name:       "a request held since well before the last answer may have looped after its wait: it alone is blamed",
		candidates: []candidate{{u: calm, flights: at(-5000)}, {u: sibling, flights: at(1300)}, {u: looper, flights: at(1200)}},
		killed:     true, want: []string{"calm"},
	}, {
		name:       "a load in progress may hold the thread; so may the first request after the last answer",
		candidates: []candidate{{u: calm, loading: true}, {u: looper, flights: at(1010)}, {u: sibling, flights: at(1050)}},
		killed:     true, want: []string{"calm", "looper"},
	}, {
		name: "a binding call of the request that took the thread, and its own call in turn",
		candidates: []candidate{
			{u: sibling, flights: at(1030)},
			{u: callee, flights: []begun{{at: ms(1040), caller: "looper", open: true}}},
			{u: calm, flights: []begun{{at: ms(1050), caller: "callee", open: true}}},
			{u: looper, flights: at(1010)},
		},
		killed: true, want: []string{"callee", "calm", "looper"},
	}, {
		name: "a call whose end the router has not reported yet is judged by its caller, done here",
		candidates: []candidate{
			{u: sibling},
			{u: callee, flights: []begun{{at: ms(990), caller: "sibling", open: true}}},
			{u: looper, flights: at(1010)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a WebSocket open since long before is not blamed for a loop that began on a free thread",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, open: true}}},
			{u: sibling, flights: at(1300)}, {u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor for one that waited behind the last response",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, open: true}}},
			{u: looper, flights: at(998)}, {u: sibling, flights: at(1020)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "when no request waits for its answer, those that answered are blamed (a loop in a stream or a WebSocket)",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, open: true}}},
			{u: looper, flights: []begun{{at: ms(500), answered: true, open: true}}},
			{u: sibling},
		},
		killed: true, want: []string{"calm", "looper"},
	}, {
		name: "a WebSocket with a message not answered yet took the thread, not a request queued behind",
		candidates: []candidate{
			{u: looper, flights: []begun{{at: ms(-60000), answered: true, input: ms(1010), output: ms(700), open: true}}},
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, input: ms(900), output: ms(905), open: true}}},
			{u: sibling, flights: at(1020)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a WebSocket whose client's last message no answer followed, before the last answer, waits for nothing",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, input: ms(900), output: ms(700), open: true}}},
			{u: looper, flights: at(1010)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor one whose worker answered its last message",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, input: ms(1005), output: ms(1005), open: true}}},
			{u: looper, flights: at(1010)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a load in progress, not the WebSockets open beside it",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, open: true}}},
			{u: looper, loading: true},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a request waiting for its worker's fetch since before the last answer is not blamed for a loop that began on a free thread",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-4990)},
			{u: sibling, flights: at(1300)}, {u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor when its request has ended with the kill, as blame reads it (unanswered, among the ended)",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-5000)}}, subrequests: waitingFor(-4990), ended: []span{{began: ms(-5000), ended: ms(4000)}}},
			{u: sibling, flights: []begun{{at: ms(1300)}}}, {u: looper, flights: []begun{{at: ms(1200)}}},
		},
		killed: true, want: []string{"looper"}}, {
		name: "nor for a loop that waited behind the last response",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-4990)},
			{u: looper, flights: at(998)}, {u: sibling, flights: at(1020)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a subrequest sent while two requests of its worker were in flight is neither's: the later is judged as any (the earlier has its own)",
		candidates: []candidate{
			{u: calm, flights: at(-5000, 400), subrequests: waitingFor(450, -4990)},
			{u: looper, flights: at(998)}, {u: sibling, flights: at(1020)},
		},
		killed: true, want: []string{"calm", "looper"},
	}, {
		name: "a request's own subrequest sent since the last answer shows it ran since: its earlier one excuses nothing",
		candidates: []candidate{
			{u: looper, flights: at(-5000), subrequests: waitingFor(-4990, 1100)},
			{u: sibling, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor does one whose body was still being made at the kill, or was made since the last answer: its code ran",
		candidates: []candidate{
			{u: looper, flights: at(-5000), subrequests: []subrequest{{began: ms(-4990)}}},
			{u: calm, flights: at(-3000), subrequests: []subrequest{{began: ms(-2990), sent: ms(1100)}}},
			{u: sibling, flights: at(1200)},
		},
		killed: true, want: []string{"looper", "calm"},
	}, {
		name: "one answered before the last answer whose body its worker was still making at the kill shows it ran since",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: append([]subrequest{{began: ms(-4990), answered: ms(500)}}, waitingFor(-4980)...)},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "and so does one sent since the last answer, though it ended unanswered (its worker gave up on it, and may loop)",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: append(waitingFor(-4990), subrequest{began: ms(1100), sent: ms(1100), ended: ms(1150)})},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"}}, {
		name: "a subrequest answered before the last answer neither excuses its request nor shows it ran since",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: append([]subrequest{{began: ms(-4990), sent: ms(-4990), answered: ms(900), ended: ms(950)}}, waitingFor(-4980)...)},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a WebSocket whose client's message came after the last answer is judged by that message, not excused by a fetch sent before",
		candidates: []candidate{
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, input: ms(1010), output: ms(700), open: true}}, subrequests: waitingFor(-4990)},
			{u: sibling, flights: at(1300)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "even for a request in flight across the last answer",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(1100)},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "nor one whose request came first after the last answer: it cannot be told from a looper (README)",
		candidates: []candidate{
			{u: calm, flights: at(1010), subrequests: waitingFor(1011)},
			{u: sibling, flights: at(1300)}, {u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "nor does one sent while both were in flight excuse either",
		candidates: []candidate{
			{u: looper, flights: at(-5000, -4000), subrequests: waitingFor(-3990)},
			{u: sibling, flights: at(1300)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a fetch another request sent as it answered (ctx.waitUntil) is not the looper's, queued behind it",
		candidates: []candidate{
			{u: looper, flights: at(990), subrequests: waitingFor(995), ended: []span{{began: ms(985), ended: ms(1000)}}},
			{u: sibling, flights: at(1200, 1800)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor one sent just after a request ended: its ctx.waitUntil work may have sent it",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-4990), ended: []span{{began: ms(-6000), ended: ms(-5050)}}},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "a request that ended well before the subrequest was sent did not send it",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-4990), ended: []span{{began: ms(-6000), ended: ms(-5500)}}},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a request that ended before a subrequest was sent is no sender, though it is read among those in flight (it ended unanswered)",
		candidates: []candidate{
			{u: sibling},
			{u: calm, flights: []begun{{at: ms(-5000), open: true}, {at: ms(-7000), caller: "sibling"}}, subrequests: waitingFor(-4990), ended: []span{{began: ms(-7000), ended: ms(-6000)}}},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor is one sent when a request the unit forgot may have been in flight anyone's",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-4990), endedBefore: ms(-4995)},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "a request with several subrequests, one answered since the last answer, may have gone on from that one",
		candidates: []candidate{
			{u: looper, flights: at(-5000), subrequests: []subrequest{{began: ms(-4990), sent: ms(-4990), answered: ms(1300)}, {began: ms(-4980), sent: ms(-4980)}}},
			{u: sibling, flights: at(1400)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a worker with a call into this process in flight is excused nothing: the loop may be its callee's",
		candidates: []candidate{
			{u: looper, flights: at(-5000), subrequests: waitingFor(-4990, -4985)},
			{u: callee, flights: []begun{{at: ms(-4984), caller: "looper", open: true}}},
			{u: sibling, flights: at(1300)},
		},
		killed: true, want: []string{"looper", "callee"},
	}, {
		name: "a request that came during the hang does not take the excuse of its worker's earlier one",
		candidates: []candidate{
			{u: calm, flights: at(-5000, 2000), subrequests: waitingFor(-4990)},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a subrequest begun before the request is not its own: the request is blamed",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: waitingFor(-6000)},
			{u: sibling, flights: at(1300)}, {u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "a worker's request begun after all its subrequests is judged as any: it may loop",
		candidates: []candidate{
			{u: looper, flights: at(-5000, 200), subrequests: waitingFor(-4990, -4980)},
			{u: sibling, flights: at(1300)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "a fetch answered before the last answer excuses nothing: its request went on from it, in flight across the last answer as any",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: []subrequest{{began: ms(-4990), sent: ms(-4990), answered: ms(900)}}},
			{u: sibling, flights: at(-3000)}, {u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm", "sibling"},
	}, {
		name: "nor a fetch whose body still streams, answered before the last answer: the request reading it is blamed, not a later sibling",
		candidates: []candidate{
			{u: looper, flights: at(500), subrequests: []subrequest{{began: ms(510), sent: ms(510), answered: ms(700)}}},
			{u: sibling, flights: at(1300, 1400)},
		},
		killed: true, want: []string{"looper"},
	}, {
		name: "nor a fetch its worker stopped waiting for",
		candidates: []candidate{
			{u: calm, flights: at(-5000), subrequests: []subrequest{{began: ms(-4990), sent: ms(-4990), ended: ms(900)}}},
			{u: looper, flights: at(1200)},
		},
		killed: true, want: []string{"calm"},
	}, {
		// Wrong when the loop is the looper's; but a request that fetched, went on from the answer
		// and looped, with a sibling waiting since before the answer, looks the same (README).
		name: "a fetch answered during the hang excuses nothing: its request may have gone on from the answer and looped",
		candidates: []candidate{
			{u: calm, flights: at(-500), subrequests: []subrequest{{began: ms(-490), sent: ms(-490), answered: ms(1500), ended: ms(1501)}}},
			{u: looper, flights: at(1200)}, {u: sibling, flights: at(1600)},
		},
		killed: true, want: []string{"calm"},
	}, {
		name: "a binding call into this process is no subrequest to wait for: the caller answers for its callee",
		candidates: []candidate{
			{u: looper, flights: at(-5000), subrequests: waitingFor(-4990)},
			{u: callee, flights: []begun{{at: ms(-4989), caller: "looper", open: true}}},
			{u: sibling, flights: at(1300)},
		},
		killed: true, want: []string{"looper", "callee"},
	}, {
		name: "when nothing else waits, a request waiting for a fetch is blamed (it fetched, then looped), not the WebSockets open beside it",
		candidates: []candidate{
			{u: looper, flights: at(500), subrequests: waitingFor(510)},
			{u: calm, flights: []begun{{at: ms(-60000), answered: true, open: true}}},
			{u: sibling},
		},
		killed: true, want: []string{"looper"},
	}, {
		name:       "an abort implicates every request in flight",
		candidates: []candidate{{u: sibling, flights: at(1900)}, {u: calm}, {u: looper, flights: at(1010)}},
		killed:     false, want: []string{"sibling", "looper"},
	}, {
		name:       "nothing in flight",
		candidates: []candidate{{u: sibling}, {u: looper}},
		killed:     true, want: nil,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, names(blame(tc.candidates, tc.killed, answer)))
		})
	}
}

// A unit remembers when its last maxEnded requests that reached it began and ended, and the latest
// end of those it forgot: blame reads them to know which requests were in flight when a subrequest
// was sent. A withdrawn request never reached it.
func TestAUnitRemembersItsLastEndedRequests(t *testing.T) {
	t.Parallel()
	u := &unit{inc: &Incarnation{spec: Spec{Meter: egress.NewMeter(0, 0, 0)}}, open: map[*flight]struct{}{}}
	end := func(withdraw bool) {
		fl, ok := u.Acquire()
		require.True(t, ok)
		if withdraw {
			fl.(*flight).Withdraw()
			return
		}
		fl.Done()
	}
	end(true)
	c := u.candidate(0)
	ended, before := c.ended, c.endedBefore
	require.Empty(t, ended, "a withdrawn request is not remembered")
	require.Zero(t, before)
	for range maxEnded {
		end(false)
	}
	c = u.candidate(0)
	ended, before = c.ended, c.endedBefore
	require.Len(t, ended, maxEnded)
	require.Zero(t, before, "nothing forgotten yet")
	first := ended[0]
	require.LessOrEqual(t, first.began, first.ended)
	end(false)
	c = u.candidate(0)
	ended, before = c.ended, c.endedBefore
	require.Len(t, ended, maxEnded)
	require.Equal(t, first.ended, before, "the forgotten one's end is kept")
}
