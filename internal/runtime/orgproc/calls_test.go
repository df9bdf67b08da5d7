package orgproc

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A call run in the process stays counted until the router reports its end, once, with whether
// the callee answered; the calls a dead process was running end unanswered (so that its death
// implicates the callees it was running, SPEC 5.1).
func TestCallsEndOnceAsReportedOrUnansweredWithTheirProcess(t *testing.T) {
	var c calls
	ends := map[uint64][]bool{}
	hold := func() uint64 {
		var id uint64
		id = c.hold(time.Minute, func(answered bool) { ends[id] = append(ends[id], answered) })
		return id
	}
	a, b, d := hold(), hold(), hold()

	c.ended("1:1,not a call,2:0,99:1")
	require.Equal(t, map[uint64][]bool{a: {true}, b: {false}}, ends)
	c.ended("1:0")
	require.Equal(t, []bool{true}, ends[a], "a call ends once")

	c.endAll()
	require.Equal(t, []bool{false}, ends[d], "its process ended under it")
	c.ended("3:1")
	require.Equal(t, []bool{false}, ends[d])
	require.Empty(t, c.held)
}
