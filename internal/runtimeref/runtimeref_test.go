package runtimeref

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/vectors"
)

type referenceVector struct {
	Name             string `json:"name"`
	MaterialSetNonce string `json:"materialSetNonce"`
	Target           struct {
		Space                 string `json:"space"`
		WorkerName            string `json:"workerName"`
		BundleName            string `json:"bundleName"`
		EndpointName          string `json:"endpointName"`
		OriginReservationID   string `json:"originReservationId"`
		CanonicalPublicOrigin string `json:"canonicalPublicOrigin"`
	} `json:"target"`
	Bindings map[string]string `json:"bindings"`
	Expect   struct {
		Canonical             string `json:"canonical"`
		SHA256                string `json:"sha256"`
		PreparationID         string `json:"preparationId"`
		RuntimeInputReference string `json:"runtimeInputReference"`
	} `json:"expect"`
}

func TestDeriveMatchesSharedVectors(t *testing.T) {
	t.Parallel()
	var all []referenceVector
	require.NoError(t, vectors.Load("runtime-input-reference.json", &all))
	require.NotEmpty(t, all)
	for _, v := range all {
		t.Run(v.Name, func(t *testing.T) {
			id := Derive(v.MaterialSetNonce, Target{
				Space: v.Target.Space, WorkerName: v.Target.WorkerName, BundleName: v.Target.BundleName,
				EndpointName: v.Target.EndpointName, OriginReservationID: v.Target.OriginReservationID,
				CanonicalPublicOrigin: v.Target.CanonicalPublicOrigin,
			}, v.Bindings)
			require.Equal(t, v.Expect.Canonical, string(id.Canonical))
			require.Equal(t, v.Expect.SHA256, id.Digest)
			require.Equal(t, v.Expect.PreparationID, id.PreparationID)
			require.Equal(t, v.Expect.RuntimeInputReference, id.Reference)
		})
	}
}
