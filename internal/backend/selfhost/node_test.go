package selfhost

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
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

// TestAnAdmissionIsAwaitedWithTheNodesLongPollAndPolledOnAnOlderNode runs Apply against an
// admin API that admits the deployment some time after the PUT. A node that answers versions is
// asked to hold the read until the status changes (one plain read, then one long poll); an older
// node, whose answers carry no version and which ignores a wait, is polled until it admits.
func TestAnAdmissionIsAwaitedWithTheNodesLongPollAndPolledOnAnOlderNode(t *testing.T) {
	t.Parallel()
	for _, longPoll := range []bool{true, false} {
		t.Run(fmt.Sprintf("long poll %v", longPoll), func(t *testing.T) {
			t.Parallel()
			deployment := uuid.New()
			admitted := make(chan struct{})
			var reads, waits atomic.Int32
			status := func() adminapi.ScriptStatus {
				st := adminapi.ScriptStatus{ScriptName: "s", Present: true, DeploymentID: deployment.String(), Reason: adminapi.ReasonPending}
				select {
				case <-admitted:
					st.Ready, st.Reason = true, adminapi.ReasonReady
				default:
				}
				if longPoll {
					st.Version = st.Reason
				}
				return st
			}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodGet {
					reads.Add(1)
					if since, wait := r.URL.Query().Get("since"), r.URL.Query().Get("wait"); since != "" && wait != "" {
						waits.Add(1)
						d, err := time.ParseDuration(wait)
						if longPoll && err == nil && since == status().Version {
							select {
							case <-admitted:
							case <-time.After(d):
							}
						}
					}
				}
				w.Header().Set("Content-Type", "application/json")
				_ = json.NewEncoder(w).Encode(status())
			}))
			t.Cleanup(srv.Close)
			tokenFile := filepath.Join(t.TempDir(), "admin-token")
			require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
			n := NewMutator(catalog.Installation{Name: "node", Pack: catalog.PackSelfhost, RuntimeURL: srv.URL, RuntimeTokenFile: tokenFile}, backend.PackEnv{})

			time.AfterFunc(700*time.Millisecond, func() { close(admitted) })
			obs, err := n.Apply(context.Background(), backend.Desired{
				Kind: backend.NativeWorker, NativeName: "s", DeploymentID: deployment, EffectID: uuid.New(), ResourceUID: uuid.New(), Sequence: 1,
				Bundle: &backend.Bundle{Modules: map[string]string{"main.js": "export default {}"}, MainModule: "main.js", CompatibilityDate: "2025-01-01"},
			})
			require.NoError(t, err)
			require.True(t, obs.Admitted, "Apply answered before the node admitted the deployment")
			if longPoll {
				require.Equal(t, int32(2), reads.Load(), "one read, then one long poll held until the admission")
				require.Equal(t, int32(1), waits.Load())
			} else {
				require.Greater(t, reads.Load(), int32(3), "an older node is polled")
				require.Zero(t, waits.Load(), "an answer without a version is never waited on")
			}
		})
	}
}

// Before a runtime input is claimed, an installation with a pool key asks its node which pool key
// it holds, and a node that could not open the delivery (no key, another pool's, or a runtime too
// old to answer) is refused as misconfigured, naming what it holds; a node holding it is not asked
// again for a while.
func TestADeliveryIsCheckedAgainstThePoolKeyTheNodeHolds(t *testing.T) {
	t.Parallel()
	ours, err := poolkey.Generate("node")
	require.NoError(t, err)
	theirs, err := poolkey.Generate("other")
	require.NoError(t, err)
	var held atomic.Pointer[adminapi.Pool]
	var asked atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, adminapi.PathPool, r.URL.Path)
		asked.Add(1)
		w.Header().Set("Content-Type", "application/json")
		p := held.Load()
		if p == nil {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(adminapi.Problem{Status: http.StatusNotFound, Code: "not_found", Title: "Not found"})
			return
		}
		_ = json.NewEncoder(w).Encode(p)
	}))
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	check := func() error {
		n := NewMutator(catalog.Installation{Name: "node", Pack: catalog.PackSelfhost, RuntimeURL: srv.URL, RuntimeTokenFile: tokenFile,
			PoolPublicKey: ours.Public().String()}, backend.PackEnv{})
		return n.(backend.DeliveryCheck).CheckDelivery(context.Background())
	}
	err = check()
	require.ErrorIs(t, err, backend.ErrMisconfigured, "a runtime too old to know pools")
	require.ErrorContains(t, err, "holds no pool key")
	held.Store(&adminapi.Pool{})
	require.ErrorContains(t, check(), "holds no pool key")
	held.Store(&adminapi.Pool{Pool: "other", PublicKey: theirs.Public().String()})
	require.ErrorContains(t, check(), `of pool "other"`)
	held.Store(&adminapi.Pool{Pool: "node", PublicKey: ours.Public().String()})
	n := NewMutator(catalog.Installation{Name: "node", Pack: catalog.PackSelfhost, RuntimeURL: srv.URL, RuntimeTokenFile: tokenFile,
		PoolPublicKey: ours.Public().String()}, backend.PackEnv{})
	before := asked.Load()
	require.NoError(t, n.(backend.DeliveryCheck).CheckDelivery(context.Background()))
	require.NoError(t, n.(backend.DeliveryCheck).CheckDelivery(context.Background()))
	require.Equal(t, before+1, asked.Load(), "a node found holding the key is not asked again at once")

	plain := NewMutator(catalog.Installation{Name: "node", Pack: catalog.PackSelfhost, RuntimeURL: srv.URL, RuntimeTokenFile: tokenFile}, backend.PackEnv{})
	require.NoError(t, plain.(backend.DeliveryCheck).CheckDelivery(context.Background()), "no pool key named: nothing to check")
}
