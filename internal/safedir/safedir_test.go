package safedir

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func requireUnsafe(t *testing.T, err error, reason string) {
	t.Helper()
	var unsafe *UnsafePathError
	require.ErrorAs(t, err, &unsafe)
	require.Contains(t, unsafe.Reason, reason)
}

func TestEnsureCreatesPrivateDirectory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "a", "private")
	require.NoError(t, Ensure(path, Current()))
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, DirMode, info.Mode().Perm())
	// A second call accepts the directory it made.
	require.NoError(t, Ensure(path, Current()))
}

func TestEnsureRefusesSymlink(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	real := filepath.Join(base, "real")
	require.NoError(t, os.Mkdir(real, 0o700))
	link := filepath.Join(base, "link")
	require.NoError(t, os.Symlink(real, link))
	requireUnsafe(t, Ensure(link, Current()), "symlink")
}

func TestEnsureRefusesNonDirectory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, []byte("x"), 0o600))
	requireUnsafe(t, Ensure(path, Current()), "not a directory")
}

func TestEnsureRefusesWrongModeAndLeavesIt(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(path, 0o755))
	require.NoError(t, os.Chmod(path, 0o755))
	requireUnsafe(t, Ensure(path, Current()), "mode")
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), info.Mode().Perm(), "an unsafe path is refused, never repaired")
}

func TestEnsureRefusesWrongOwner(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("changing a directory's owner needs root")
	}
	path := filepath.Join(t.TempDir(), "theirs")
	require.NoError(t, os.Mkdir(path, 0o700))
	require.NoError(t, os.Chown(path, 65534, os.Getegid()))
	requireUnsafe(t, Ensure(path, Current()), "owned by uid 65534")

	group := filepath.Join(t.TempDir(), "group")
	require.NoError(t, os.Mkdir(group, 0o700))
	require.NoError(t, os.Chown(group, os.Geteuid(), 65534))
	requireUnsafe(t, Ensure(group, Current()), "group")
}

func TestWriteFileIsPrivateAndRefusesSymlinkTarget(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, Ensure(dir, Current()))
	require.NoError(t, WriteFile(dir, "key", []byte("one"), Current()))
	require.NoError(t, WriteFile(dir, "key", []byte("two"), Current()))
	got, err := ReadFile(dir, "key", Current())
	require.NoError(t, err)
	require.Equal(t, "two", string(got))
	info, err := os.Stat(filepath.Join(dir, "key"))
	require.NoError(t, err)
	require.Equal(t, FileMode, info.Mode().Perm())

	elsewhere := filepath.Join(t.TempDir(), "elsewhere")
	require.NoError(t, os.WriteFile(elsewhere, []byte("x"), 0o600))
	require.NoError(t, os.Symlink(elsewhere, filepath.Join(dir, "link")))
	requireUnsafe(t, WriteFile(dir, "link", []byte("y"), Current()), "not a regular file")
	_, err = ReadFile(dir, "link", Current())
	requireUnsafe(t, err, "not a regular file")

	require.NoError(t, os.Chmod(filepath.Join(dir, "key"), 0o644))
	_, err = ReadFile(dir, "key", Current())
	requireUnsafe(t, err, "mode")
	require.False(t, errors.Is(err, os.ErrNotExist))
	// Nor is it replaced: the unsafe file is refused and left as it is.
	requireUnsafe(t, WriteFile(dir, "key", []byte("three"), Current()), "mode")
	info, err = os.Stat(filepath.Join(dir, "key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o644), info.Mode().Perm())
}
