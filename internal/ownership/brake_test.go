package ownership_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// TestADeploymentBrakeCoversItsScopeAndNothingElse: a brake on the whole Host covers every
// organization; one on an organization covers its workers and no other organization's; one on a
// worker covers that worker alone. Engaging twice and releasing what is not engaged change nothing,
// and a scope that names a worker without its organization is refused.
func TestADeploymentBrakeCoversItsScopeAndNothingElse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, _ := testdb.CountedPool(t, 2)
	_, err := db.Exec(ctx, "INSERT INTO organizations (id, name) VALUES ('org_aaaaaaaa', 'a'), ('org_bbbbbbbb', 'b')")
	require.NoError(t, err)
	braked := func(org, space, worker string) bool {
		err := ownership.CheckBrake(ctx, db, org, space, worker)
		if err != nil {
			require.True(t, apierr.Is(err, apierr.DeploymentBrake), "%v", err)
		}
		return err != nil
	}
	set := func(b ownership.DeploymentBrake, on bool) {
		t.Helper()
		require.NoError(t, ownership.SetDeploymentBrake(ctx, db, b, on))
	}

	host, orgA, worker := ownership.DeploymentBrake{}, ownership.DeploymentBrake{OrganizationID: "org_aaaaaaaa"},
		ownership.DeploymentBrake{OrganizationID: "org_aaaaaaaa", Space: "prod", Worker: "api"}
	require.Equal(t, "*", host.Scope())
	require.Equal(t, "org_aaaaaaaa", orgA.Scope())
	require.Equal(t, "org_aaaaaaaa/prod/api", worker.Scope())

	set(worker, true)
	set(worker, true)
	require.True(t, braked("org_aaaaaaaa", "prod", "api"))
	require.False(t, braked("org_aaaaaaaa", "prod", "web"), "another worker of the organization")
	require.False(t, braked("org_bbbbbbbb", "prod", "api"), "another organization's worker of the same name")
	set(worker, false)
	set(worker, false)
	require.False(t, braked("org_aaaaaaaa", "prod", "api"))

	set(orgA, true)
	require.True(t, braked("org_aaaaaaaa", "prod", "web"))
	require.True(t, braked("org_aaaaaaaa", "", ""))
	require.False(t, braked("org_bbbbbbbb", "prod", "web"))
	set(orgA, false)

	set(host, true)
	require.True(t, braked("org_bbbbbbbb", "prod", "web"))
	set(host, false)
	require.False(t, braked("org_bbbbbbbb", "prod", "web"))

	require.Error(t, ownership.SetDeploymentBrake(ctx, db, ownership.DeploymentBrake{Space: "prod", Worker: "api"}, true))
	require.Error(t, ownership.SetDeploymentBrake(ctx, db, ownership.DeploymentBrake{OrganizationID: "org_aaaaaaaa", Space: "prod"}, true))
}
