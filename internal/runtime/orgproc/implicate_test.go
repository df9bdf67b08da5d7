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

// A process unanswered for StallAfter is presumed held by a loop only in an organization liveness
// killed a process of lately and whose loop is not already in quarantine: there a shared process
// slow at the least weight is only slow, and elsewhere a late probe may be a long computation.
func TestALoopIsPresumedOnlyInASuspectOrganizationWithoutAQuarantine(t *testing.T) {
	t.Parallel()
	m := &Manager{opts: Options{SuspectFor: time.Minute}, procs: map[procKey]*Process{}}
	m.procs[procKey{org: "org-a"}] = nil
	require.False(t, m.presumedLooping("org-a"), "never killed: a late probe may be a long computation")
	m.suspected("org-a")
	require.True(t, m.presumedLooping("org-a"), "killed for a loop a moment ago")
	require.False(t, m.presumedLooping("org-b"), "another organization is no suspect")
	m.procs[procKey{org: "org-a", alone: "inc-1"}] = nil
	require.False(t, m.presumedLooping("org-a"), "its loop runs in quarantine: its shared process is only slow")
	m.procs[procKey{org: "org-b", alone: "inc-2"}] = nil
	delete(m.procs, procKey{org: "org-a", alone: "inc-1"})
	require.True(t, m.presumedLooping("org-a"), "another organization's quarantine is not its own")
}
