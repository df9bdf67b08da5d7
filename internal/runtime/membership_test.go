package runtime_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// A node's place in its pool (SPEC 6.2), as the Host tells it: the edge's health check answers
// 200 only for a serving member; a draining member keeps serving workers for the pool's fence,
// then serves none; a member of a pool of two or more restarted serves nothing until the Host
// confirms it; a retired node serves nothing and cannot be told otherwise; an older epoch is
// refused.
func TestANodeServesOnlyWhatItsPlaceInThePoolAllows(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	f.script("echo", "uid-echo", 1, "v1")
	f.route("echo.workers.localhost", "echo", "ep-echo")
	f.waitReady("echo")
	serves := func() int {
		code, _, _, _ := f.h.TryGet("echo.workers.localhost", "/")
		return code
	}
	health := func() int {
		code, _ := healthz(f, "127.0.0.1")
		return code
	}
	require.Equal(t, http.StatusOK, serves(), "a node never told its place serves, as before pools")
	require.Equal(t, http.StatusOK, health())

	tell := func(m adminapi.Membership) (adminapi.MembershipStatus, error) {
		return f.client.SetMembership(f.ctx, m)
	}
	boot := func() string {
		st, err := f.client.Membership(f.ctx)
		require.NoError(t, err)
		require.NotEmpty(t, st.Boot)
		return st.Boot
	}
	base := adminapi.Membership{Pool: "selfhost", Node: "node-a", Epoch: 1, PoolSize: 3, FenceSeconds: 1, Confirms: boot()}
	joining := base
	joining.State = adminapi.MemberJoining
	st, err := tell(joining)
	require.NoError(t, err)
	require.True(t, st.Confirmed && st.Routes)
	require.Equal(t, http.StatusOK, serves(), "a joining member routes")
	require.Equal(t, http.StatusServiceUnavailable, health(), "but the load balancer is not sent to it yet")

	serving := base
	serving.State = adminapi.MemberServing
	_, err = tell(serving)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, health())

	// Restarted as a member of a pool of three: nothing until the Host confirms it.
	f.h.Restart(t)
	f.reconnect()
	require.Equal(t, http.StatusServiceUnavailable, serves(), "a restarted member may have missed a deletion")
	require.Equal(t, http.StatusServiceUnavailable, health())
	got, err := f.client.Membership(f.ctx)
	require.NoError(t, err)
	require.False(t, got.Confirmed)
	require.Contains(t, got.Reason, "until the Host confirms")
	unconfirmed := serving
	unconfirmed.Confirms = ""
	_, err = tell(unconfirmed)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, serves(), "told its place without being found up to date")
	_, err = tell(serving)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, serves(), "a confirmation of its start before the restart confirms nothing")
	serving.Confirms = boot()
	base.Confirms = serving.Confirms
	_, err = tell(serving)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, serves())

	// Draining: the health check fails at once, the workers are served for the fence, then not.
	draining := base
	draining.State = adminapi.MemberDraining
	since := time.Now()
	draining.DrainingSince = &since
	_, err = tell(draining)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, health())
	require.Equal(t, http.StatusOK, serves(), "it serves on while the load balancers take it out")
	require.Eventually(t, func() bool { return serves() == http.StatusServiceUnavailable }, 5*time.Second, 50*time.Millisecond, "drained")
	longer := draining
	longer.FenceSeconds = 600
	_, err = tell(longer)
	require.NoError(t, err)
	require.Equal(t, http.StatusServiceUnavailable, serves(), "a drained node does not serve again when told a longer fence")

	// An older epoch is refused; a retired node serves nothing and cannot be brought back.
	retired := base
	retired.State, retired.Epoch = adminapi.MemberRetired, 2
	_, err = tell(retired)
	require.NoError(t, err)
	_, err = tell(serving)
	require.True(t, selfhost.IsCode(err, adminapi.CodeStaleMembership), "epoch 1 after epoch 2: %v", err)
	serving.Epoch = 3
	_, err = tell(serving)
	require.True(t, selfhost.IsCode(err, adminapi.CodeStaleMembership), "a retired node comes back only wiped, under a new name: %v", err)
	f.h.Restart(t)
	f.reconnect()
	require.Equal(t, http.StatusServiceUnavailable, serves(), "retired, across a restart")

	// From the state it starts on, a retired node takes no write (a Host replica with an older
	// view of the pool may still send one): no script, route, delivery or tick. What it holds can
	// still be deleted.
	_, err = f.client.PutScript(f.ctx, "other", f.scriptPut("uid-other", 1, "v1"))
	require.True(t, selfhost.IsCode(err, adminapi.CodeLeftPool), "a script: %v", err)
	_, err = f.client.PutRoute(f.ctx, "other.workers.localhost", adminapi.RoutePut{EffectID: f.effect(), ScriptName: "echo", EndpointUID: "ep-other", DeploymentID: "dep-ep-other"})
	require.True(t, selfhost.IsCode(err, adminapi.CodeLeftPool), "a route: %v", err)
	_, err = f.client.PutSecrets(f.ctx, "echo", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: "uid-echo", DeliveryID: "d-1", Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret("canary-left-pool")}})
	require.True(t, selfhost.IsCode(err, adminapi.CodeLeftPool), "a delivery: %v", err)
	_, err = f.client.RunScheduled(f.ctx, "echo", adminapi.ScheduledRun{})
	require.True(t, selfhost.IsCode(err, adminapi.CodeLeftPool), "a tick: %v", err)
	_, err = f.client.DeleteRoute(f.ctx, "echo.workers.localhost", "echo", "ep-echo")
	require.NoError(t, err, "what it holds is still taken down")
}
