package runtime

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// A script whose code cannot be read from the node's store now (a file gone, a read that
// failed) gets no identity, and that failure is not kept: the next reconcile reads again, and
// once the file reads the script runs. A bundle that does not pass its checks is kept as it is.
func TestAnUnreadableBundleIsReadAgainNotKeptAsTheScriptsFailure(t *testing.T) {
	t.Parallel()
	key := filepath.Join(t.TempDir(), "sealing-key")
	require.NoError(t, state.WriteSealingKeyFile(key))
	dir := filepath.Join(t.TempDir(), "state")
	store, err := state.Open(dir, state.SealingKey{File: key})
	require.NoError(t, err)
	t.Cleanup(store.Close)
	d, err := store.Load()
	require.NoError(t, err)
	s := &state.Script{Name: "s", MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Modules: state.NewCode(map[string]string{"index.js": "export default {}"})}
	d.Scripts["s"] = s
	require.NoError(t, store.Save(d))
	require.False(t, s.Modules.Held())

	n := &Node{store: store}
	r := &scriptRun{}
	file := filepath.Join(dir, "bundles", s.Modules.Ref())
	kept := file + ".away"
	require.NoError(t, os.Rename(file, kept))
	_, err = n.wantLocked(r, s, true)
	require.Error(t, err)
	require.True(t, unreadable(err), "%v", err)
	require.Nil(t, r.want.of, "a failed read is not kept as the script's identity")

	require.NoError(t, os.Rename(kept, file))
	want, err := n.wantLocked(r, s, true)
	require.NoError(t, err)
	require.Equal(t, s, r.want.of)
	again, err := identity(s, func(state.Code) (map[string]string, error) { panic("read again") })
	require.NoError(t, err, "the bundle's digest is kept once it was read")
	require.Equal(t, want.id, again.id)

	bad := &state.Script{Name: "b", MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Modules: state.NewCode(map[string]string{"lib.js": "export const x = 1"})}
	_, err = n.wantLocked(r, bad, true)
	require.Error(t, err)
	require.False(t, unreadable(err))
	require.Equal(t, bad, r.want.of, "a bundle that fails its checks is kept as it is")
}
