package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// TestRuleTombstonesAreKeptThirtyDaysByDefault: "tombstones are kept 30 days" (SPEC 3.2). The
// Host is configured with no retention of its own (the server's default; takoserver's flag has
// the same default, TestServeKeepsTombstonesThirtyDaysByDefault). A deleted reservation's
// tombstone refuses a late replay of its create, and survives the janitor's purge, until the
// database's clock is just short of 30 days later; just past them it is gone.
func TestRuleTombstonesAreKeptThirtyDaysByDefault(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-a", tokenA).status)
	purge := func() int64 {
		n, err := (&ownership.Manager{DB: h.db}).PurgeTombstones(context.Background())
		require.NoError(t, err)
		return n
	}

	h.advance("29 days 23 hours 59 minutes")
	require.Zero(t, purge(), "a tombstone younger than 30 days is kept")
	h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).problem(t, http.StatusGone, "tombstoned")

	h.advance("2 minutes")
	require.EqualValues(t, 1, purge(), "past 30 days it goes")
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status,
		"with the tombstone gone the token creates the key again")
}
