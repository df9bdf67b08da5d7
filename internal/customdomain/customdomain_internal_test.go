package customdomain

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// SPEC 3.7's rule for one lookup: pending backs off (5 s doubling, at most 10 minutes) and fails
// after its week; verified is revoked on the seventh absent lookup in a row, a present one starts
// the count over, and a resolver error counts for nothing.
func TestTransition(t *testing.T) {
	pending := dbsqlc.CustomDomain{Status: dbsqlc.CustomDomainStatusPending}
	var backoffs []time.Duration
	for checks := int32(0); checks < 10; checks++ {
		pending.Checks = checks
		c := transition(pending, look{Absent, "nx"}, false)
		require.Equal(t, dbsqlc.CustomDomainStatusPending, c.status)
		backoffs = append(backoffs, c.next)
	}
	require.Equal(t, 5*time.Second, backoffs[0])
	require.Equal(t, 10*time.Second, backoffs[1])
	require.Equal(t, 10*time.Minute, backoffs[9], "capped")
	require.Equal(t, dbsqlc.CustomDomainStatusFailed, transition(pending, look{Absent, "nx"}, true).status)
	require.Equal(t, dbsqlc.CustomDomainStatusVerified, transition(pending, look{Present, "ok"}, true).status, "found in its last hour")

	verified := dbsqlc.CustomDomain{Status: dbsqlc.CustomDomainStatusVerified}
	for i := int32(1); i <= AbsentChecksRevoke; i++ {
		c := transition(verified, look{Absent, "nx"}, false)
		require.Equal(t, i, c.absent)
		if i < AbsentChecksRevoke {
			require.Equal(t, dbsqlc.CustomDomainStatusVerified, c.status)
		} else {
			require.Equal(t, dbsqlc.CustomDomainStatusRevoked, c.status)
		}
		unknown := transition(dbsqlc.CustomDomain{Status: dbsqlc.CustomDomainStatusVerified, AbsentInARow: c.absent - 1}, look{Unknown, "timeout"}, false)
		require.Equal(t, c.absent-1, unknown.absent, "a resolver error counts for nothing")
		require.Equal(t, unknownRetry, unknown.next)
		verified.AbsentInARow = c.absent
	}
	verified.AbsentInARow = 6
	require.Zero(t, transition(verified, look{Present, "ok"}, false).absent, "a record seen again starts over")
}

// Names a claim may take, and the refusals of those it may not.
func TestParse(t *testing.T) {
	c := catalog.Default()
	for _, ok := range []string{"app.example.com", "*.example.com", "a-b.c.example.co.uk", "xn--bcher-kva.example"} {
		_, err := Parse(c, ok)
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"", "App.example.com", "example.com.", "com", "co.uk", "*.co.uk", "*.*.example.com",
		"a.*.example.com", "127.0.0.1", "10.1", "[::1]", "xn--zz.example.com", "-a.example.com", "a_b.example.com",
		"x.workers.localhost", "workers.localhost", "*.workers.dev"} {
		_, err := Parse(c, bad)
		require.Error(t, err, bad)
	}
}
