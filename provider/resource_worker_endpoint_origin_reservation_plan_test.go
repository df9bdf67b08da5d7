package provider

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// An available origin plans; one this organization holds is a warning (most often the
// reservation this plan replaces); one another organization holds fails the plan, whatever the
// Host says of it beyond "other".
func TestAReservationPlanJudgesWhoHoldsItsOrigin(t *testing.T) {
	t.Parallel()
	require.Equal(t, available, originVerdict(client.Derivation{Available: true}))
	require.Equal(t, heldBySelf, originVerdict(client.Derivation{HeldBy: &client.Holder{Organization: "self", Kind: "reservation", Name: "res-old"}}))
	require.Equal(t, heldByOther, originVerdict(client.Derivation{HeldBy: &client.Holder{Organization: "other"}}))
	require.Equal(t, heldByOther, originVerdict(client.Derivation{}), "unavailable without a holder is refused")
}

// A reservation created without an id gets one derived from what it holds, the same at plan and
// at apply; a subdomain or offering moves it, and without either it is the first version's id.
func TestADefaultReservationIDFollowsWhatItHolds(t *testing.T) {
	t.Parallel()
	base := defaultReservationID("prod", "api", "", "")
	require.Regexp(t, `^res-[0-9a-f]{16}$`, base)
	require.Equal(t, base, defaultReservationID("prod", "api", "", ""))
	require.NotEqual(t, base, defaultReservationID("prod", "web", "", ""))
	require.NotEqual(t, base, defaultReservationID("prod", "api", "shop", ""))
	require.NotEqual(t, defaultReservationID("prod", "api", "shop", ""), defaultReservationID("prod", "api", "", "shop"))
}
