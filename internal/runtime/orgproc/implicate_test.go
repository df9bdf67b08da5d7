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
