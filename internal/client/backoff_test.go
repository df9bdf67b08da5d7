package client

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBackoffDoublesToItsCapAndHonoursACappedRetryAfter: the delay before retry n is drawn from
// [d/2, d] with d = 200 ms doubling per attempt and capped at 5 s, however many attempts; a
// Host's Retry-After is followed but never past 30 s.
func TestBackoffDoublesToItsCapAndHonoursACappedRetryAfter(t *testing.T) {
	t.Parallel()
	for attempt := range 64 {
		d := min(200*time.Millisecond<<min(attempt, 6), 5*time.Second)
		lo, hi := d, time.Duration(0)
		for range 200 {
			w := backoff(attempt, 0)
			lo, hi = min(lo, w), max(hi, w)
		}
		require.GreaterOrEqual(t, lo, d/2, "attempt %d", attempt)
		require.LessOrEqual(t, hi, d, "attempt %d: the delay is capped at %s", attempt, d)
		require.Greater(t, hi-lo, d/10, "attempt %d: the delay is jittered", attempt)
	}
	require.LessOrEqual(t, backoff(1000, 0), 5*time.Second)
	require.Equal(t, 3*time.Second, backoff(0, 3*time.Second), "Retry-After is followed")
	require.Equal(t, 30*time.Second, backoff(0, time.Hour), "but never past 30 s")
}
