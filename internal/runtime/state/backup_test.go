package state

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// A backup holds the desired state, its bundles and the sealed deliveries, never the admin token
// nor a value in clear; restored into an empty directory (or, with Replace, over a later state,
// keeping that directory's admin token) a node opens it as it was, delivery included.
func TestABackupRestoresTheStateItWasTakenFrom(t *testing.T) {
	t.Parallel()
	const canary = "canary-backup-4c1e"
	key := testKey(t)
	dir := filepath.Join(t.TempDir(), "runtime")
	s, err := Open(dir, key)
	require.NoError(t, err)
	d, err := s.Load()
	require.NoError(t, err)
	d.Scripts["a"] = &Script{Name: "a", WorkerUID: "uid-a", Generation: 3, Modules: NewCode(map[string]string{"index.js": "export default {}"}), MainModule: "index.js",
		Delivery: &Delivery{DeliveryID: "d1", WorkerUID: "uid-a", Names: []string{"TOKEN"}}}
	d.Routes["a.example"] = &Route{Hostname: "a.example", ScriptName: "a"}
	require.NoError(t, s.SealSecrets("uid-a", "d1", map[string]vocab.Secret{"TOKEN": vocab.NewSecret(canary)}))
	require.NoError(t, s.Save(d))
	var backup bytes.Buffer
	require.NoError(t, s.Backup(&backup, d))
	token := s.Token()

	names, content := unpack(t, backup.Bytes())
	require.Equal(t, "backup.json", names[0], "the manifest comes first")
	require.Contains(t, names, "desired.json")
	require.Contains(t, names, "secrets/uid-a")
	require.NotContains(t, names, "admin-token")
	require.NotContains(t, content, canary)
	require.NotContains(t, content, token)

	// A later state, then the backup over it.
	d.Scripts["b"] = &Script{Name: "b", WorkerUID: "uid-b", Generation: 4, Modules: NewCode(map[string]string{"index.js": "b"}), MainModule: "index.js"}
	delete(d.Scripts, "a")
	require.NoError(t, s.Save(d))
	require.ErrorContains(t, Restore(bytes.NewReader(backup.Bytes()), dir, RestoreOptions{Replace: true}), "in use by another runtime node")
	s.Close()
	require.ErrorContains(t, Restore(bytes.NewReader(backup.Bytes()), dir, RestoreOptions{}), "--replace")
	require.NoError(t, Restore(bytes.NewReader(backup.Bytes()), dir, RestoreOptions{Replace: true}))

	for _, into := range []string{dir, filepath.Join(t.TempDir(), "fresh")} {
		if into != dir {
			require.NoError(t, Restore(bytes.NewReader(backup.Bytes()), into, RestoreOptions{}))
		}
		back, err := Open(into, key)
		require.NoError(t, err)
		got, err := back.Load()
		require.NoError(t, err)
		require.Equal(t, []string{"a"}, keys(got.Scripts), into)
		require.Equal(t, map[string]string{"index.js": "export default {}"}, modulesOf(t, back, got.Scripts["a"].Modules))
		require.Equal(t, "a", got.Routes["a.example"].ScriptName)
		values, err := back.OpenSecrets("uid-a", "d1")
		require.NoError(t, err)
		require.Equal(t, canary, values["TOKEN"].Reveal())
		if into == dir {
			require.Equal(t, token, back.Token(), "the directory's admin token is kept")
		}
		back.Close()
	}
}

// A restore unpacks only what a backup holds: anything else (another path, a link, a file
// outside the directory) is refused, and a damaged or foreign archive too.
func TestARestoreRefusesWhatNoBackupHolds(t *testing.T) {
	t.Parallel()
	archive := func(entries ...tar.Header) []byte {
		var b bytes.Buffer
		gz := gzip.NewWriter(&b)
		tw := tar.NewWriter(gz)
		for _, h := range entries {
			body := []byte(`{"format":"` + BackupFormat + `","desiredVersion":4}`)
			if h.Typeflag == tar.TypeReg {
				h.Size = int64(len(body))
			}
			h.Mode = 0o600
			require.NoError(t, tw.WriteHeader(&h))
			if h.Typeflag == tar.TypeReg {
				_, err := tw.Write(body)
				require.NoError(t, err)
			}
		}
		require.NoError(t, tw.Close())
		require.NoError(t, gz.Close())
		return b.Bytes()
	}
	manifest := tar.Header{Name: "backup.json", Typeflag: tar.TypeReg}
	for name, tc := range map[string]struct {
		data []byte
		want string
	}{
		"traversal":      {archive(manifest, tar.Header{Name: "secrets/../../escape", Typeflag: tar.TypeReg}), "no file of a runtime backup"},
		"a link":         {archive(manifest, tar.Header{Name: "secrets/uid", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"}), "not a regular file"},
		"the token":      {archive(manifest, tar.Header{Name: "admin-token", Typeflag: tar.TypeReg}), "no file of a runtime backup"},
		"no manifest":    {archive(tar.Header{Name: "desired.json", Typeflag: tar.TypeReg}), "manifest"},
		"no state":       {archive(manifest), "holds no desired.json"},
		"not an archive": {[]byte("hello"), "not a runtime backup"},
	} {
		dir := filepath.Join(t.TempDir(), "runtime")
		err := Restore(bytes.NewReader(tc.data), dir, RestoreOptions{})
		require.ErrorContains(t, err, tc.want, name)
		_, err = os.Stat(filepath.Join(dir, "desired.json"))
		require.ErrorIs(t, err, os.ErrNotExist, "%s: no state is left behind", name)
	}
	_, err := os.Stat(filepath.Join(t.TempDir(), "escape"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

func unpack(t *testing.T, b []byte) ([]string, string) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	var names []string
	var all strings.Builder
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		require.Equal(t, int64(0o600), h.Mode, h.Name)
		names = append(names, h.Name)
		c, err := io.ReadAll(tr)
		require.NoError(t, err)
		all.Write(c)
	}
	return names, all.String()
}

// A node's place in its pool goes with its backup (SPEC 6.2): restored anywhere, a member of a
// pool of two or more comes back as one (and serves nothing until the Host confirms it).
func TestABackupCarriesTheNodesPlaceInItsPool(t *testing.T) {
	t.Parallel()
	key := testKey(t)
	dir := filepath.Join(t.TempDir(), "runtime")
	s, err := Open(dir, key)
	require.NoError(t, err)
	d, err := s.Load()
	require.NoError(t, err)
	place := []byte(`{"pool":"selfhost","node":"node-2","state":"serving","epoch":3,"poolSize":3,"fenceSeconds":300}`)
	require.NoError(t, safedir.WriteFile(dir, MembershipFile, place, s.Owner()))
	var backup bytes.Buffer
	require.NoError(t, s.Backup(&backup, d))
	s.Close()
	names, _ := unpack(t, backup.Bytes())
	require.Contains(t, names, MembershipFile)
	fresh := filepath.Join(t.TempDir(), "fresh")
	require.NoError(t, Restore(bytes.NewReader(backup.Bytes()), fresh, RestoreOptions{}))
	back, err := Open(fresh, key)
	require.NoError(t, err)
	defer back.Close()
	got, err := safedir.ReadFile(fresh, MembershipFile, back.Owner())
	require.NoError(t, err)
	require.JSONEq(t, string(place), string(got))
}
