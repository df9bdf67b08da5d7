package orgproc

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
)

// What an earlier run of the node kept is taken up within IncidentWindow of this run's beginning
// only (an incarnation started later is another deployment of the same content, and starts
// afresh), recorded again until then, and kept across a start that failed: the next start takes
// it up. Implications older than the window are forgotten, and a record left with nothing is not
// written.
func TestRecordsOfAnEarlierRunAreTakenUpOnlyWithinTheWindowAndSurviveAFailedStart(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var got map[string]Record
	m, err := New(Options{
		SocketsDir: t.TempDir(), ChannelsDir: t.TempDir(),
		Records: map[string]Record{
			"looper": {Implications: []time.Time{now.Add(-10 * time.Minute), now.Add(-2 * time.Minute)}, Quarantined: true},
			"stale":  {Implications: []time.Time{now.Add(-2 * IncidentWindow)}},
		},
		Recorded: func(r map[string]Record) { got = r },
	})
	require.NoError(t, err)
	recorded := func() []string {
		m.record()
		return slices.Sorted(maps.Keys(got))
	}
	require.Equal(t, []string{"looper"}, recorded(), "the stale implication is forgotten")

	// A start that fails (its process cannot open its sockets) keeps the record for the next.
	require.NoError(t, m.socketsDir.Close())
	_, err = m.Start(Spec{ID: "looper", Script: "looper", Org: "org", Code: func() (*Code, error) { return &Code{}, nil }, Meter: egress.NewMeter(0, 0, 0)})
	require.Error(t, err)
	require.Equal(t, []string{"looper"}, recorded())
	m.mu.Lock()
	r, ok := m.rememberedLocked("looper")
	m.mu.Unlock()
	require.True(t, ok)
	require.True(t, r.Quarantined)
	require.Len(t, r.Implications, 2)

	// Past the window after the node began, nothing kept is taken up, or written again.
	m.mu.Lock()
	m.began = now.Add(-IncidentWindow)
	_, ok = m.rememberedLocked("looper")
	m.mu.Unlock()
	require.False(t, ok)
	require.Empty(t, recorded())
}
