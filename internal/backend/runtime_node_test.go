package backend

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

func TestAnUnresponsiveWorkerReadsNotReadyWithItsReasonAndIsNoFailedDeployment(t *testing.T) {
	t.Parallel()
	obs := scriptObservation(adminapi.ScriptStatus{
		ScriptName: "s", Present: true, DeploymentID: "8b0d3c4e-3f43-4c57-9a4f-0c1b8f0e7a11", Reason: adminapi.ReasonUnresponsive,
		Incarnation: &adminapi.Incarnation{State: adminapi.StatePending, Reason: adminapi.ReasonUnresponsive,
			Message: "missed 3 liveness probes in a row; restarting in 250ms"},
	})
	require.False(t, obs.Ready)
	require.Equal(t, adminapi.ReasonUnresponsive, obs.Reason, "the worker's Ready condition names why")
	require.Contains(t, obs.Message, "missed 3 liveness probes")
	require.False(t, obs.Failed, "a stuck worker is restarted, not a deployment that failed (no 422 for the next apply)")
	require.False(t, obs.Admitted)
}
