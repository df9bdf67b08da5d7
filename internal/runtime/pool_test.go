package runtime_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// poolKey writes a new key of pool "local" into a private directory and returns its file.
func poolKey(t *testing.T) (string, *poolkey.Private) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pool")
	require.NoError(t, os.Mkdir(dir, 0o700))
	key, err := poolkey.Generate("local")
	require.NoError(t, err)
	path := filepath.Join(dir, "pool-key")
	require.NoError(t, poolkey.WriteFile(path, key))
	return path, key
}

// A pool's delivery (SPEC 6.2): the node opens a blob sealed to its pool's key for the worker UID
// and delivery it names, and serves the values; a blob for another worker, delivery or pool is
// refused and changes nothing; a restore is taken only where the worker's script holds exactly the
// delivery it replaces (none, or a superseded one), so it never replaces a newer one; a node
// without the pool key refuses a sealed delivery.
func TestANodeOpensOnlyTheDeliveriesSealedToItsPool(t *testing.T) {
	t.Parallel()
	file, key := poolKey(t)
	f := setup(t, func(c *runtime.Config) { c.PoolKeyFile = file })
	seal := func(uid, delivery, value string) []byte {
		blob, err := poolkey.Seal(key.Public(), "local", poolkey.Binding{WorkerUID: uid, DeliveryID: delivery}, []byte(`{"TOKEN":"`+value+`"}`))
		require.NoError(t, err)
		return blob
	}
	put := func(uid, delivery string, blob []byte, restore bool) error {
		_, err := f.client.PutSecrets(f.ctx, "pooled", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: uid, DeliveryID: delivery, Sealed: blob, Restore: restore})
		return err
	}
	restoreOver := func(delivery, replaces, value string) error {
		_, err := f.client.PutSecrets(f.ctx, "pooled", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: "uid-pooled", DeliveryID: delivery,
			Sealed: seal("uid-pooled", delivery, value), Restore: true, Replaces: replaces})
		return err
	}
	f.script("pooled", "uid-pooled", 1, "v1", "TOKEN")
	f.route("pooled.workers.localhost", "pooled", "ep-pooled")

	require.ErrorContains(t, put("uid-pooled", "delivery-1", seal("uid-other", "delivery-1", "pool-canary-1"), false), "does not open with this node's pool key")
	require.ErrorContains(t, put("uid-pooled", "delivery-1", seal("uid-pooled", "delivery-2", "pool-canary-1"), false), "does not open")
	other, err := poolkey.Seal(key.Public(), "elsewhere", poolkey.Binding{WorkerUID: "uid-pooled", DeliveryID: "delivery-1"}, []byte(`{"TOKEN":"x"}`))
	require.NoError(t, err)
	require.ErrorContains(t, put("uid-pooled", "delivery-1", other, false), `pool "local"`)
	st, err := f.client.GetScript(f.ctx, "pooled")
	require.NoError(t, err)
	require.False(t, st.Secrets.Delivered, "a refused delivery changes nothing")

	require.NoError(t, put("uid-pooled", "delivery-1", seal("uid-pooled", "delivery-1", "pool-canary-1"), true), "a restore where none is held")
	f.waitReady("pooled")
	f.answers("pooled.workers.localhost", expectReply("v1", "pool-canary-1"))

	require.ErrorContains(t, put("uid-pooled", "delivery-0", seal("uid-pooled", "delivery-0", "pool-canary-0"), true), adminapi.CodeDeliveryHeld)
	require.ErrorContains(t, restoreOver("delivery-0", "delivery-9", "pool-canary-0"), adminapi.CodeDeliveryHeld, "it replaces another than the one held")
	require.ErrorContains(t, restoreOver("delivery-1", "", "pool-canary-1"), adminapi.CodeDeliveryHeld, "the one held already")
	st, err = f.client.GetScript(f.ctx, "pooled")
	require.NoError(t, err)
	require.Equal(t, "delivery-1", st.Secrets.DeliveryID, "a restore never replaces a delivery it does not name")
	f.answers("pooled.workers.localhost", expectReply("v1", "pool-canary-1"))

	require.NoError(t, put("uid-pooled", "delivery-2", seal("uid-pooled", "delivery-2", "pool-canary-2"), false))
	f.waitStatus("the new delivery serves", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Secrets.DeliveryID == "delivery-2" }, "pooled")
	f.answers("pooled.workers.localhost", expectReply("v1", "pool-canary-2"))

	require.NoError(t, restoreOver("delivery-3", "delivery-2", "pool-canary-3"), "a restore over the superseded delivery it names")
	f.waitStatus("the restored delivery serves", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Secrets.DeliveryID == "delivery-3" }, "pooled")
	f.answers("pooled.workers.localhost", expectReply("v1", "pool-canary-3"))
	require.NotContains(t, f.h.Logs.String(), "pool-canary")

	held, err := f.client.Pool(f.ctx)
	require.NoError(t, err)
	require.Equal(t, adminapi.Pool{Pool: "local", PublicKey: key.Public().String()}, held, "the node says which pool key it holds")

	bare := setup(t)
	held, err = bare.client.Pool(bare.ctx)
	require.NoError(t, err)
	require.Equal(t, adminapi.Pool{}, held)
	bare.script("pooled", "uid-pooled", 1, "v1", "TOKEN")
	_, err = bare.client.PutSecrets(bare.ctx, "pooled", adminapi.SecretsPut{EffectID: bare.effect(), WorkerUID: "uid-pooled", DeliveryID: "delivery-1",
		Sealed: seal("uid-pooled", "delivery-1", "pool-canary-1")})
	require.ErrorContains(t, err, "no pool key")
}
