package state

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func openStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := Open(dir, testKey(t))
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

func bundleNames(t *testing.T, stateDir string) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(stateDir, bundlesDir))
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// A save writes what changed: desired.json names each script's modules by digest, a bundle is
// written once however many saves and scripts name it, and one nothing names is removed.
func TestASaveWritesEachBundleOnceAndDesiredJSONStaysSmall(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	d, err := s.Load()
	require.NoError(t, err)
	big := func(tag string) Code {
		return NewCode(map[string]string{"index.js": "export default {}\n// " + tag + strings.Repeat(" padding", 64<<10)})
	}
	shared := big("shared")
	for _, name := range []string{"a", "b", "c"} {
		d.Scripts[name] = &Script{Name: name, Generation: 1, Modules: big(name), MainModule: "index.js"}
	}
	d.Scripts["d"] = &Script{Name: "d", Generation: 1, Modules: shared, MainModule: "index.js",
		Serving: &Served{Generation: 1, Modules: shared, MainModule: "index.js"}}
	require.NoError(t, s.Save(d))
	require.Len(t, bundleNames(t, dir), 4, "one file per distinct set of modules")
	info, err := os.Stat(filepath.Join(dir, desiredFile))
	require.NoError(t, err)
	require.Less(t, info.Size(), int64(8<<10), "desired.json holds no modules")

	before := map[string]os.FileInfo{}
	for _, name := range bundleNames(t, dir) {
		before[name], err = os.Stat(filepath.Join(dir, bundlesDir, name))
		require.NoError(t, err)
	}
	// Another save, and a script replaced by one of new code: only the new code is written.
	next := *d
	next.Scripts = map[string]*Script{}
	for k, v := range d.Scripts {
		next.Scripts[k] = v
	}
	next.Routes["h.example"] = &Route{Hostname: "h.example", ScriptName: "a"}
	c := *d.Scripts["c"]
	c.Generation, c.Modules = 2, big("c2")
	next.Scripts["c"] = &c
	// A new deployment of the same code (a new request: an equal Code, not the same one).
	a := *d.Scripts["a"]
	a.Generation, a.Modules = 2, big("a")
	next.Scripts["a"] = &a
	require.NoError(t, s.Save(&next))
	after := bundleNames(t, dir)
	require.Len(t, after, 4, "the replaced code's bundle is removed")
	kept := 0
	for _, name := range after {
		if b := before[name]; b != nil {
			now, err := os.Stat(filepath.Join(dir, bundlesDir, name))
			require.NoError(t, err)
			require.True(t, os.SameFile(b, now), "bundle %s was written again", name)
			kept++
		}
	}
	require.Equal(t, 3, kept)
	for _, name := range after {
		now, err := os.Stat(filepath.Join(dir, bundlesDir, name))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), now.Mode().Perm())
	}

	// A node restarted on the directory reads every script's modules back, the incumbent's too,
	// and its first save writes nothing again.
	s.Close()
	s2 := openStore(t, dir)
	back, err := s2.Load()
	require.NoError(t, err)
	for name, want := range next.Scripts {
		require.True(t, want.Modules.Equal(back.Scripts[name].Modules), name)
		require.False(t, back.Scripts[name].Modules.Held(), "a start holds no code: it is read on demand")
		require.Equal(t, modulesOf(t, s2, want.Modules), modulesOf(t, s2, back.Scripts[name].Modules), name)
		// A save keeps an unchanged script's JSON from the last one, never a replaced one's.
		require.Equal(t, want.Generation, back.Scripts[name].Generation, name)
	}
	require.Equal(t, modulesOf(t, s2, shared), modulesOf(t, s2, back.Scripts["d"].Serving.Modules))
	require.Equal(t, "a", back.Routes["h.example"].ScriptName)
	require.NoError(t, s2.Save(back))
	for _, name := range bundleNames(t, dir) {
		now, err := os.Stat(filepath.Join(dir, bundlesDir, name))
		require.NoError(t, err)
		if b := before[name]; b != nil {
			require.True(t, os.SameFile(b, now), "bundle %s was written again after a restart", name)
		}
	}
}

// A state directory written by a runtime of version 1 (modules inline in desired.json) is read,
// and its next save moves the modules into bundles/.
func TestADesiredStateOfVersion1IsReadAndMovedToBundles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	old := `{"version":1,"scripts":{"a":{"name":"a","workerUid":"w","generation":4,"modules":{"index.js":"v1 code"},"mainModule":"index.js",
	  "admitted":"inc-1","serving":{"generation":3,"modules":{"index.js":"v0 code"},"mainModule":"index.js"}}},"routes":{},"effects":{}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, desiredFile), []byte(old), 0o600))
	d, err := s.Load()
	require.NoError(t, err)
	require.Equal(t, map[string]string{"index.js": "v1 code"}, modulesOf(t, s, d.Scripts["a"].Modules))
	require.Equal(t, map[string]string{"index.js": "v0 code"}, modulesOf(t, s, d.Scripts["a"].Serving.Modules))
	require.Equal(t, "inc-1", d.Scripts["a"].Admitted)
	require.NoError(t, s.Save(d))
	b, err := os.ReadFile(filepath.Join(dir, desiredFile))
	require.NoError(t, err)
	require.NotContains(t, string(b), "v1 code")
	var f map[string]any
	require.NoError(t, json.Unmarshal(b, &f))
	require.EqualValues(t, desiredVersion, f["version"])
	require.Len(t, bundleNames(t, dir), 2)
}

// A bundle that is missing, or whose content is not the digest it is named by, is refused at load:
// the node would otherwise serve other code than it was given.
func TestAMissingOrDamagedBundleIsRefusedAtLoad(t *testing.T) {
	t.Parallel()
	for _, damage := range []string{"missing", "changed"} {
		t.Run(damage, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join(t.TempDir(), "runtime")
			s := openStore(t, dir)
			d, err := s.Load()
			require.NoError(t, err)
			d.Scripts["a"] = &Script{Name: "a", Generation: 1, Modules: NewCode(map[string]string{"index.js": "the code"}), MainModule: "index.js"}
			require.NoError(t, s.Save(d))
			names := bundleNames(t, dir)
			require.Len(t, names, 1)
			path := filepath.Join(dir, bundlesDir, names[0])
			if damage == "missing" {
				require.NoError(t, os.Remove(path))
			} else {
				require.NoError(t, os.WriteFile(path, []byte(`{"index.js":"other code"}`), 0o600))
			}
			s.Close()
			s2 := openStore(t, dir)
			_, err = s2.Load()
			require.Error(t, err)
			require.Contains(t, err.Error(), names[0])
		})
	}
}

// A file a crash left in bundles/ (a bundle written before the desired state that would have
// named it, or half a write) is removed by the next save.
func TestASaveRemovesWhatACrashLeftInBundles(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	for _, name := range []string{"0123abcd", ".0123abcd.tmp-99"} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, bundlesDir, name), []byte("left"), 0o600))
	}
	d, err := s.Load()
	require.NoError(t, err)
	d.Scripts["a"] = &Script{Name: "a", Generation: 1, Modules: NewCode(map[string]string{"index.js": "x"}), MainModule: "index.js"}
	require.NoError(t, s.Save(d))
	names := bundleNames(t, dir)
	require.Len(t, names, 1)
	require.NotContains(t, names, "0123abcd")
}

// desired.json names bundles by digest only: a name that is not one (a path, say) is refused
// before any file is opened. And a file in bundles/ that is not the node's own (another mode) is
// never removed or rewritten: the operator decides, as for every unsafe private path.
func TestABundleNameIsADigestAndForeignFilesAreLeftAlone(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "runtime")
	s := openStore(t, dir)
	escape := `{"version":2,"scripts":{"a":{"name":"a","modulesRef":"../secrets/w","mainModule":"index.js"}},"routes":{},"effects":{}}`
	require.NoError(t, os.WriteFile(filepath.Join(dir, desiredFile), []byte(escape), 0o600))
	_, err := s.Load()
	require.ErrorContains(t, err, "not a SHA-256")

	require.NoError(t, os.Remove(filepath.Join(dir, desiredFile)))
	foreign := filepath.Join(dir, bundlesDir, "left-by-someone")
	require.NoError(t, os.WriteFile(foreign, []byte("x"), 0o600))
	require.NoError(t, os.Chmod(foreign, 0o644))
	d, err := s.Load()
	require.NoError(t, err)
	d.Scripts["a"] = &Script{Name: "a", Generation: 1, Modules: NewCode(map[string]string{"index.js": "x"}), MainModule: "index.js"}
	require.NoError(t, s.Save(d))
	_, err = os.Stat(foreign)
	require.NoError(t, err, "a file that is not the node's own was removed")
}
