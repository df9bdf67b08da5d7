package egress

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDenyListHoldsEveryNodeAddressThePublishedEdgeAndTheOperatorsRanges(t *testing.T) {
	t.Parallel()
	extra, err := ParseDeny([]string{"203.0.113.7/24", " 2001:db8::1/32 "})
	require.NoError(t, err)
	require.Equal(t, []string{"203.0.113.0/24", "2001:db8::/32"}, extra, "canonical network form")
	deny, err := DenyList([]string{"198.51.100.9:443", "0.0.0.0:8787", "edge.example:80"}, extra)
	require.NoError(t, err)
	addrs, err := net.InterfaceAddrs()
	require.NoError(t, err)
	for _, a := range addrs {
		ip := a.(*net.IPNet).IP
		want := ip.String() + "/128"
		if ip.To4() != nil {
			want = ip.To4().String() + "/32"
		}
		require.Contains(t, deny, want, "every address of this node's interfaces")
	}
	require.Contains(t, deny, "198.51.100.9/32", "the published edge's address")
	require.NotContains(t, deny, "0.0.0.0/32", "an unspecified listen address names no address")
	require.Contains(t, deny, "203.0.113.0/24")
	require.Contains(t, deny, "2001:db8::/32")
	again, err := DenyList([]string{"198.51.100.9:443", "0.0.0.0:8787", "edge.example:80"}, extra)
	require.NoError(t, err)
	require.Equal(t, deny, again, "the same addresses give the same list (and so the same config)")
}

func TestParseDenyRefusesWhatIsNotACIDR(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"10.0.0.1", "example.com/24", "", `1.2.3.4/32"]`} {
		_, err := ParseDeny([]string{bad})
		require.Error(t, err, bad)
	}
}
