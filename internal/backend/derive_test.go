package backend

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/vectors"
)

type derivedNamesVector struct {
	TenantRef               string `json:"tenantRef"`
	Space                   string `json:"space"`
	WorkerName              string `json:"workerName"`
	WorkerUID               string `json:"workerUid"`
	ScriptName              string `json:"scriptName"`
	ManagedDefaultLabel     string `json:"managedDefaultLabel"`
	HostMintedReservationID string `json:"hostMintedReservationId"`
}

// loadVectors reads the shared derived-name vectors.
func loadVectors(t *testing.T) []derivedNamesVector {
	t.Helper()
	var out []derivedNamesVector
	require.NoError(t, vectors.Load("derived-names.json", &out))
	require.NotEmpty(t, out)
	return out
}

func TestDerivedNamesMatchSharedVectors(t *testing.T) {
	t.Parallel()
	for _, v := range loadVectors(t) {
		w := WorkerRef{TenantRef: v.TenantRef, Space: v.Space, Name: v.WorkerName, UID: v.WorkerUID}
		require.Equal(t, v.ScriptName, ScriptName(w), "script name of %+v", w)
		require.Equal(t, v.ManagedDefaultLabel, DerivedProviderResourceName("tsw", w), "managed label of %+v", w)
		require.Equal(t, v.HostMintedReservationID, HostMintedReservationID(w), "minted id of %+v", w)
	}
}

func TestScriptNameReadablePart(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, space, readable string }{
		{"API", "Prod", "api-prod"},
		{"my__worker", "a-b", "my-worker-a-b"},
		{"x", "_", "x"},
		{"_", "_", "w"},
		{"a234567890123456789012345678901234567890123456789012345", "s", "a23456789012345678901234567890123456789012345678901234"},
		{"a23456789012345678901234567890123456789012345678901-", "s", "a23456789012345678901234567890123456789012345678901-s"},
		{"a2345678901234567890123456789012345678901234567890123", "s", "a2345678901234567890123456789012345678901234567890123"},
	}
	for _, c := range cases {
		got := ScriptName(WorkerRef{TenantRef: "org_x", Space: c.space, Name: c.name})
		require.Equal(t, c.readable, got[:len(got)-9], "%s/%s", c.space, c.name)
		require.Len(t, got[len(got)-8:], 8)
	}
}
