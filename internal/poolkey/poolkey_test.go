package poolkey_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// A blob opens only with its pool's private key, for the pool, worker UID and delivery it was
// sealed for, and not once altered; the Host's side (the public key) cannot open it at all.
func TestABlobOpensOnlyForItsPoolWorkerAndDelivery(t *testing.T) {
	t.Parallel()
	priv, err := poolkey.Generate("local")
	require.NoError(t, err)
	pub, err := poolkey.ParsePublic(priv.Public().String())
	require.NoError(t, err)
	b := poolkey.Binding{WorkerUID: "0b7c1c5e-3c1a-4d7e-9a51-1f0e8a3b2c4d", DeliveryID: "5f2d9c1e-7a3b-4c8d-9e0f-1a2b3c4d5e6f"}
	plain := []byte(`{"TOKEN":"canary-pool-5c1d"}`)
	blob, err := poolkey.Seal(pub, "local", b, plain)
	require.NoError(t, err)
	require.NotContains(t, string(blob), "canary-pool-5c1d")

	got, err := priv.Open(b, blob)
	require.NoError(t, err)
	require.Equal(t, plain, got)

	other, err := poolkey.Generate("local")
	require.NoError(t, err)
	_, err = other.Open(b, blob)
	require.ErrorIs(t, err, poolkey.ErrNotForThis, "another pool key")
	_, err = priv.Open(poolkey.Binding{WorkerUID: b.WorkerUID, DeliveryID: "another"}, blob)
	require.ErrorIs(t, err, poolkey.ErrNotForThis, "another delivery")
	_, err = priv.Open(poolkey.Binding{WorkerUID: "another", DeliveryID: b.DeliveryID}, blob)
	require.ErrorIs(t, err, poolkey.ErrNotForThis, "another worker")
	elsewhere, err := poolkey.Seal(pub, "other-pool", b, plain)
	require.NoError(t, err)
	_, err = priv.Open(b, elsewhere)
	require.ErrorIs(t, err, poolkey.ErrNotForThis, "another pool's name")
	altered := append([]byte(nil), blob...)
	altered[len(altered)-1] ^= 1
	_, err = priv.Open(b, altered)
	require.ErrorIs(t, err, poolkey.ErrNotForThis, "altered")
	again, err := poolkey.Seal(pub, "local", b, plain)
	require.NoError(t, err)
	require.NotEqual(t, blob, again, "every seal is fresh")
}

// The key file is a new 0600 file in a private directory, read back whole; an existing file is
// never overwritten, and an unsafe one is refused, not repaired.
func TestTheKeyFileIsPrivateAndNeverOverwritten(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, safedir.Ensure(dir, safedir.Current()))
	path := filepath.Join(dir, "pool-key")
	priv, err := poolkey.Generate("local")
	require.NoError(t, err)
	require.NoError(t, poolkey.WriteFile(path, priv))
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())

	read, err := poolkey.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "local", read.Pool)
	require.Equal(t, priv.Public().String(), read.Public().String())

	other, err := poolkey.Generate("local")
	require.NoError(t, err)
	require.ErrorContains(t, poolkey.WriteFile(path, other), "never overwritten")
	again, err := poolkey.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, priv.Public().String(), again.Public().String())

	require.NoError(t, os.Chmod(path, 0o644))
	_, err = poolkey.ReadFile(path)
	var unsafe *safedir.UnsafePathError
	require.ErrorAs(t, err, &unsafe)
	info, err = os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), info.Mode().Perm(), "refused, not repaired")

	for _, bad := range []string{"", "ed25519:AAAA", "x25519:not base64!", "x25519:AAAA"} {
		_, err := poolkey.ParsePublic(bad)
		require.Error(t, err, bad)
	}
}
