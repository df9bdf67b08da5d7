package reservation

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// A caller writes only ids of its own namespace; a read of an id no reservation can have is
// not found, without a lookup.
func TestReservationIDs(t *testing.T) {
	t.Parallel()
	require.NoError(t, CheckID("res-api"))
	require.True(t, apierr.Is(CheckID("hostmint-"+"0123456789abcdef0123456789abcdef01234567"), apierr.HostMintNamespace))
	require.True(t, apierr.Is(CheckID("Res API"), apierr.InvalidRequest))
	require.NoError(t, CheckReadableID("hostmint-0123456789abcdef0123456789abcdef01234567"), "a minted id is readable")
	require.True(t, apierr.Is(CheckReadableID("Res API"), apierr.NotFound))
}

// A request resolves to the worker's own derived address unless it chooses another label, and
// a chosen label is refused where it could take a derived address (SPEC 3.3): the shape of a v2
// script name, a managed default label, the minted prefix, or a label the operator reserved.
func TestARequestResolvesToItsOwnAddressAndAChosenLabelIsChecked(t *testing.T) {
	t.Parallel()
	cat := catalog.DefaultWithRuntime("http://127.0.0.1:1", "/nonexistent", "127.0.0.1:1")
	cat.ReservedLabels = map[string]bool{"www": true}
	s := &Service{Catalog: cat}
	org := auth.Organization{ID: "org_a", Name: "acme"}
	own, err := s.resolve(org, Request{Space: "prod", WorkerName: "api"})
	require.NoError(t, err)
	require.False(t, own.chosen)
	require.Regexp(t, `^api-prod-[0-9a-f]{32}$`, own.subdomain)
	again, err := s.resolve(org, Request{Space: "prod", WorkerName: "api", Subdomain: &own.subdomain})
	require.NoError(t, err)
	require.False(t, again.chosen, "its own label given explicitly is not a choice")
	require.Equal(t, own.origin, again.origin)
	other, err := s.resolve(auth.Organization{ID: "org_b", Name: "globex"}, Request{Space: "prod", WorkerName: "api"})
	require.NoError(t, err)
	require.NotEqual(t, own.subdomain, other.subdomain, "another organization's worker of the same name has another address")

	shop := "shop"
	chosen, err := s.resolve(org, Request{Space: "prod", WorkerName: "api", Subdomain: &shop})
	require.NoError(t, err)
	require.True(t, chosen.chosen)

	for name, label := range map[string]string{
		"another's derived": other.subdomain, "v2 shape": "x-0123456789abcdef0123456789abcdef",
		"managed": "tsw-0123456789abcdef01234567", "minted": "hostmint-x", "operator's": "www",
	} {
		_, err := s.resolve(org, Request{Space: "prod", WorkerName: "api", Subdomain: &label})
		require.True(t, apierr.Is(err, apierr.LabelReserved), "%s: %v", name, err)
	}
	for name, req := range map[string]Request{
		"space":       {Space: "Prod!", WorkerName: "api"},
		"not a label": {Space: "prod", WorkerName: "api", Subdomain: new("Shop.Example")},
		"ttl":         {Space: "prod", WorkerName: "api", TTLSeconds: new(int64(1))},
	} {
		_, err := s.resolve(org, req)
		require.True(t, apierr.Is(err, apierr.InvalidRequest), "%s: %v", name, err)
	}
}

// A fenced release names every unmet fence and, first, the resource to destroy: the activation
// before the endpoint, the endpoint before waiting on a claim.
func TestAFencedReleaseNamesWhatToDestroyFirst(t *testing.T) {
	t.Parallel()
	err := fenced("res-api", true, true, true, false, false)
	require.True(t, apierr.Is(err, apierr.ReleaseFenced))
	require.Contains(t, err.Error(), "destroy the activation")
	require.Contains(t, err.Error(), "unmet fences [activation lease_claimed endpoint_present]")
	require.Contains(t, fenced("res-api", false, true, true, false, false).Error(), "destroy the endpoint")
	require.Contains(t, fenced("res-api", false, true, false, false, false).Error(), "runtime input's claim")
	require.Contains(t, fenced("res-api", false, false, false, true, true).Error(), "wait for the endpoint's deletion to close")
}
