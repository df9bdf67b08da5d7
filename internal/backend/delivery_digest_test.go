package backend_test

import (
	"crypto/sha256"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// The value-free readback digest is SHA-256 of exactly this canonical JSON (SPEC 3.5): keys in
// this order, the secret names sorted, nothing escaped but what JSON.stringify escapes.
func TestDeliveryDigestIsSHA256OfTheCanonicalJSONOfWorkerUIDDeliveryAndSortedSecretNames(t *testing.T) {
	t.Parallel()
	want := sha256.Sum256([]byte(`{"workerUid":"9f1c2a9e-0000-4000-8000-000000000001","delivery":"prep-0123456789abcdef0123456789abcdef","secretNames":["API_KEY","DB_<URL>","Zeta"]}`))
	got := backend.DeliveryDigest("9f1c2a9e-0000-4000-8000-000000000001", "prep-0123456789abcdef0123456789abcdef", []string{"Zeta", "API_KEY", "DB_<URL>"})
	require.Equal(t, want[:], got)
	none := sha256.Sum256([]byte(`{"workerUid":"u","delivery":"","secretNames":[]}`))
	require.Equal(t, none[:], backend.DeliveryDigest("u", "", nil), "no delivery and no secrets is a value too, never a match for a delivery")
}
