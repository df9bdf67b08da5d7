package state

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// testKey writes a fresh sealing key outside any state directory.
func testKey(t *testing.T) SealingKey {
	t.Helper()
	path := filepath.Join(t.TempDir(), "runtime-sealing-key")
	require.NoError(t, WriteSealingKeyFile(path))
	return SealingKey{File: path}
}

func TestOpenKeepsTokenAndKeyAndLocks(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	key := testKey(t)
	s, err := Open(dir, key)
	require.NoError(t, err)
	token := s.Token()
	require.Len(t, token, 64)
	_, err = Open(dir, key)
	require.ErrorContains(t, err, "in use by another runtime node")
	s.Close()

	again, err := Open(dir, key)
	require.NoError(t, err)
	defer again.Close()
	require.Equal(t, token, again.Token())
	require.Equal(t, s.MAC([]byte("x")), again.MAC([]byte("x")), "the runtime key survives a restart")
	for _, path := range []string{filepath.Join(dir, "admin-token"), key.File} {
		info, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, safedir.FileMode, info.Mode().Perm())
	}
}

func TestOpenRefusesUnsafeDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	_, err := Open(dir, testKey(t))
	var unsafe *safedir.UnsafePathError
	require.ErrorAs(t, err, &unsafe)
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), info.Mode().Perm(), "refused, never repaired")
}

func TestSealedDeliveryRoundTripsAndIsNotPlainText(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s, err := Open(dir, testKey(t))
	require.NoError(t, err)
	defer s.Close()
	const canary = "canary-sealed-91c2"
	values := map[string]vocab.Secret{"TOKEN": vocab.NewSecret(canary)}
	require.NoError(t, s.SealSecrets("uid-1", "d1", values))
	raw, err := os.ReadFile(filepath.Join(dir, "secrets", "uid-1"))
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary)

	got, err := s.OpenSecrets("uid-1", "d1")
	require.NoError(t, err)
	require.Equal(t, canary, got["TOKEN"].Reveal())
	_, err = s.OpenSecrets("uid-1", "d2")
	require.Error(t, err, "a sealed file of another delivery fails closed")

	require.NoError(t, s.EraseSecrets("uid-1"))
	_, err = os.Stat(filepath.Join(dir, "secrets", "uid-1"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.Error(t, s.SealSecrets("../escape", "d1", values))
}

func TestDesiredRoundTrips(t *testing.T) {
	t.Parallel()
	s, err := Open(filepath.Join(t.TempDir(), "runtime"), testKey(t))
	require.NoError(t, err)
	defer s.Close()
	d, err := s.Load()
	require.NoError(t, err)
	require.Empty(t, d.Scripts)
	d.Scripts["a"] = &Script{Name: "a", Generation: 3}
	d.Routes["h.example"] = &Route{Hostname: "h.example", ScriptName: "a"}
	require.NoError(t, s.Save(d))
	back, err := s.Load()
	require.NoError(t, err)
	require.Equal(t, int64(3), back.Scripts["a"].Generation)
	require.Equal(t, "a", back.Routes["h.example"].ScriptName)
}
