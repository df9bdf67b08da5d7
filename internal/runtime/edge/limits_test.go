package edge_test

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

func TestParseTrustedProxiesTakesCIDRsAndAddressesAndRefusesTheRest(t *testing.T) {
	t.Parallel()
	got, err := edge.ParseTrustedProxies([]string{"10.1.2.3/8", "192.0.2.1, ::1", "::ffff:198.51.100.7"})
	require.NoError(t, err)
	require.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.1/32"),
		netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("198.51.100.7/32"),
	}, got)
	_, err = edge.ParseTrustedProxies([]string{"proxy.example"})
	require.ErrorContains(t, err, `"proxy.example"`)
}

func TestLimitsDefaultsAreSPEC51s(t *testing.T) {
	t.Parallel()
	l := edge.Limits{}.WithDefaults()
	require.Equal(t, 64<<10, l.MaxHeaderBytes)
	require.Equal(t, int64(100<<20), l.MaxBodyBytes)
	require.Equal(t, "30s", l.ResponseTimeout.String())
}
