package state

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func modulesOf(t *testing.T, s *Store, c Code) map[string]string {
	t.Helper()
	m, err := s.Modules(c)
	require.NoError(t, err)
	return m
}

// A put's code is held only until the save that writes it: from then on the node reads it from
// bundles/ when it needs it (SPEC 3.6), checked against the file's name each time.
func TestCodeIsHeldUntilItsSaveAndThenReadFromTheStore(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	modules := map[string]string{"index.js": "export default {}", "lib.js": "export const x = 1", "index.js.map": `{"version":3}`}
	code := NewCode(modules)
	require.True(t, code.Held())
	require.Equal(t, []string{"index.js", "index.js.map", "lib.js"}, code.Names())
	require.True(t, code.Has("lib.js"))
	require.False(t, code.Has("other.js"))
	require.Equal(t, int64(len("index.js")+len("export default {}")+len("lib.js")+len("export const x = 1")), code.CodeBytes(),
		"a source map is not code")

	d.Scripts["a"] = &Script{Name: "a", Generation: 1, Modules: code, MainModule: "index.js"}
	require.NoError(t, s.Save(d))
	require.False(t, code.Held(), "the save wrote the code: the node no longer holds it")
	require.Equal(t, modules, modulesOf(t, s, code))
	v, err := s.Module(code, "lib.js")
	require.NoError(t, err)
	require.Equal(t, "export const x = 1", v)

	// The same content from another put is the same bundle, and is not held after a save either.
	again := NewCode(map[string]string{"index.js": "export default {}", "lib.js": "export const x = 1", "index.js.map": `{"version":3}`})
	require.True(t, again.Equal(code))
	b := *d.Scripts["a"]
	b.Name, b.Modules = "b", again
	d.Scripts["b"] = &b
	require.NoError(t, s.Save(d))
	require.False(t, again.Held())
	require.Len(t, bundleNames(t, dir), 1)

	// A file damaged after it was written is refused when the code is read: never served.
	path := filepath.Join(dir, bundlesDir, code.Ref())
	require.NoError(t, os.WriteFile(path, []byte(`{"index.js":"export default {evil}"}`), 0o600))
	_, err = s.Modules(code)
	require.ErrorContains(t, err, "damaged")
	require.NoError(t, os.Remove(path))
	_, err = s.Modules(code)
	require.ErrorContains(t, err, "read the bundle")
}

// Digest computes once per main module for as long as its Code lives; a failure is computed again.
func TestACodesDigestIsComputedOncePerMainModule(t *testing.T) {
	t.Parallel()
	code := NewCode(map[string]string{"a.js": "a", "b.js": "b"})
	calls := 0
	compute := func() ([32]byte, error) {
		calls++
		return [32]byte{byte(calls)}, nil
	}
	_, err := code.Digest("a.js", func() ([32]byte, error) { return [32]byte{}, errors.New("not yet") })
	require.Error(t, err)
	first, err := code.Digest("a.js", compute)
	require.NoError(t, err)
	again, err := code.Digest("a.js", compute)
	require.NoError(t, err)
	require.Equal(t, first, again)
	_, err = code.Digest("b.js", compute)
	require.NoError(t, err)
	require.Equal(t, 2, calls)
}
