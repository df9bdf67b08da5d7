package backend

import (
	"strings"
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
	ScriptNameV2            string `json:"scriptNameV2"`
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
		require.Equal(t, v.ScriptName, ScriptNameV1(w), "v1 script name of %+v", w)
		require.Equal(t, v.ScriptNameV2, ScriptName(w), "v2 script name of %+v", w)
		require.LessOrEqual(t, len(ScriptName(w)), 63, "a DNS label")
		require.Equal(t, v.ManagedDefaultLabel, DerivedProviderResourceName("tsw", w), "managed label of %+v", w)
		require.Equal(t, v.HostMintedReservationID, HostMintedReservationID(w), "minted id of %+v", w)
	}
}

// The pair found in the attack shares one v1 name across two organizations; v2 tells them apart.
func TestAttackPairSharesV1NameButNotV2(t *testing.T) {
	t.Parallel()
	var victims []WorkerRef
	for _, v := range loadVectors(t) {
		if strings.HasPrefix(v.WorkerName, "victim") {
			victims = append(victims, WorkerRef{TenantRef: v.TenantRef, Space: v.Space, Name: v.WorkerName})
		}
	}
	require.Len(t, victims, 2)
	require.NotEqual(t, victims[0].TenantRef, victims[1].TenantRef)
	require.Equal(t, ScriptNameV1(victims[0]), ScriptNameV1(victims[1]))
	require.NotEqual(t, ScriptName(victims[0]), ScriptName(victims[1]))
}

func TestScriptNameReadablePart(t *testing.T) {
	t.Parallel()
	cases := []struct{ name, space, readable string }{
		{"API", "Prod", "api-prod"},
		{"my__worker", "a-b", "my-worker-a-b"},
		{"x", "_", "x"},
		{"_", "_", "w"},
		{"a2345678901234567890123456789012345", "s", "a23456789012345678901234567890"},
		{"a2345678901234567890123456789-", "s", "a2345678901234567890123456789"},
		{"a23456789012345678901234567", "s", "a23456789012345678901234567-s"},
	}
	for _, c := range cases {
		got := ScriptName(WorkerRef{TenantRef: "org_x", Space: c.space, Name: c.name})
		require.Equal(t, c.readable, got[:len(got)-33], "%s/%s", c.space, c.name)
		require.Len(t, got[len(got)-32:], 32)
		require.Equal(t, byte('-'), got[len(got)-33])
	}
}
