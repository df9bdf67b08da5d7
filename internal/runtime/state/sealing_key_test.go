package state

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// The runtime's sealing key is never in the same directory as the sealed deliveries (SPEC 5.1):
// without a key file outside the state directory the node does not open it.
func TestTheSealingKeyIsNeverInTheStateDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")

	_, err := Open(dir, SealingKey{})
	require.ErrorContains(t, err, "no sealing key: pass --sealing-key-file")

	inside := filepath.Join(dir, "runtime-sealing-key")
	require.NoError(t, WriteSealingKeyFile(inside))
	_, err = Open(dir, SealingKey{File: inside})
	require.ErrorContains(t, err, "is inside the state directory")
	require.NoError(t, os.Remove(inside))

	// Through a symlink to the state directory, too.
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(dir, link))
	_, err = Open(dir, SealingKey{File: filepath.Join(link, "secrets", "k"), CreateIfAbsent: true})
	require.ErrorContains(t, err, "is inside the state directory")

	readable := filepath.Join(t.TempDir(), "key")
	require.NoError(t, WriteSealingKeyFile(readable))
	require.NoError(t, os.Chmod(readable, 0o644))
	_, err = Open(dir, SealingKey{File: readable})
	var unsafe *safedir.UnsafePathError
	require.ErrorAs(t, err, &unsafe, "a key file others can read is refused")

	_, err = Open(dir, SealingKey{File: filepath.Join(t.TempDir(), "absent")})
	require.ErrorIs(t, err, fs.ErrNotExist, "outside the dev path a missing key is not created")

	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.NotContains(t, []string{LegacyKeyFile, "runtime-sealing-key"}, e.Name())
	}
}

// The dev path creates its key file (0600 in a 0700 directory) once and reuses it.
func TestTheDevPathCreatesItsKeyOnceOutsideTheStateDirectory(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	key := SealingKey{File: filepath.Join(base, "dev", "runtime-sealing-key"), CreateIfAbsent: true}
	s, err := Open(filepath.Join(base, "runtime"), key)
	require.NoError(t, err)
	mac := s.MAC([]byte("x"))
	s.Close()
	info, err := os.Stat(key.File)
	require.NoError(t, err)
	require.Equal(t, safedir.FileMode, info.Mode().Perm())
	require.NoError(t, safedir.Check(filepath.Dir(key.File), safedir.Current()))

	again, err := Open(filepath.Join(base, "runtime"), key)
	require.NoError(t, err)
	defer again.Close()
	require.Equal(t, mac, again.MAC([]byte("x")), "the same key on the next start")
	require.ErrorContains(t, WriteSealingKeyFile(key.File), "never overwritten")
}

// A key an earlier version kept in the state directory: `takoserver runtime` refuses and tells the
// operator how to move it; the dev path moves it once, and the deliveries sealed under it still
// open.
func TestAKeyLeftInTheStateDirectoryIsRefusedOrMovedOnceByDev(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	dir := filepath.Join(base, "runtime")
	first := filepath.Join(base, "keys", "first")
	s, err := Open(dir, SealingKey{File: first, CreateIfAbsent: true})
	require.NoError(t, err)
	require.NoError(t, s.SealSecrets("uid-1", "d1", map[string]vocab.Secret{"TOKEN": vocab.NewSecret("old-layout-canary")}))
	s.Close()
	// The layout before SPEC 5.1: the key beside the deliveries.
	legacy := filepath.Join(dir, LegacyKeyFile)
	require.NoError(t, os.Rename(first, legacy))

	moved := filepath.Join(base, "dev", "runtime-sealing-key")
	require.NoError(t, safedir.Ensure(filepath.Dir(moved), safedir.Current()))
	_, err = Open(dir, SealingKey{File: moved})
	var legacyErr *LegacyKeyError
	require.ErrorAs(t, err, &legacyErr)
	require.ErrorContains(t, err, "mv "+legacy+" "+moved)
	_, err = os.Stat(legacy)
	require.NoError(t, err, "refused, never moved behind the operator's back")
	_, err = Open(dir, SealingKey{})
	require.ErrorAs(t, err, &legacyErr)

	s, err = Open(dir, SealingKey{File: moved, CreateIfAbsent: true})
	require.NoError(t, err)
	defer s.Close()
	_, err = os.Stat(legacy)
	require.True(t, errors.Is(err, fs.ErrNotExist), "the dev path moved the key out")
	values, err := s.OpenSecrets("uid-1", "d1")
	require.NoError(t, err)
	require.Equal(t, "old-layout-canary", values["TOKEN"].Reveal())
}

// A node given a new sealing key with the one it replaces (--previous-sealing-key-file) keeps
// every delivery: at start each is sealed again under the new key, so that the next start needs
// the new key alone. Without the previous key, a delivery under another key does not open.
func TestANewSealingKeyWithItsPreviousKeepsEveryDelivery(t *testing.T) {
	t.Parallel()
	dir, keys := filepath.Join(t.TempDir(), "runtime"), t.TempDir()
	oldKey, newKey := filepath.Join(keys, "old"), filepath.Join(keys, "new")
	require.NoError(t, WriteSealingKeyFile(oldKey))
	require.NoError(t, WriteSealingKeyFile(newKey))
	s, err := Open(dir, SealingKey{File: oldKey})
	require.NoError(t, err)
	require.NoError(t, s.SealSecrets("uid-1", "d1", map[string]vocab.Secret{"TOKEN": vocab.NewSecret("rotation-canary")}))
	s.Close()

	s, err = Open(dir, SealingKey{File: newKey})
	require.NoError(t, err)
	_, err = s.OpenSecrets("uid-1", "d1")
	require.Error(t, err, "a new key alone opens nothing sealed under the old one")
	s.Close()

	s, err = Open(dir, SealingKey{File: newKey, Previous: oldKey})
	require.NoError(t, err)
	require.Equal(t, 1, s.Resealed)
	values, err := s.OpenSecrets("uid-1", "d1")
	require.NoError(t, err)
	require.Equal(t, "rotation-canary", values["TOKEN"].Reveal())
	s.Close()

	s, err = Open(dir, SealingKey{File: newKey})
	require.NoError(t, err)
	values, err = s.OpenSecrets("uid-1", "d1")
	require.NoError(t, err, "sealed again: the new key alone opens it")
	require.Equal(t, "rotation-canary", values["TOKEN"].Reveal())
	s.Close()

	_, err = Open(dir, SealingKey{File: newKey, Previous: filepath.Join(dir, "inside")})
	require.ErrorContains(t, err, "is inside the state directory", "the previous key obeys the key's rules")
}
