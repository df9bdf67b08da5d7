package catalog

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

func selfhostCatalog(t *testing.T, inst map[string]string) string {
	t.Helper()
	fields := map[string]any{"name": "node-7", "pack": PackSelfhost}
	for k, v := range inst {
		fields[k] = v
	}
	b, err := json.Marshal(map[string]any{
		"installations": []any{fields},
		"offerings":     []any{map[string]any{"id": "o", "kind": KindWorker, "installation": "node-7", "soldTo": []string{"*"}}},
	})
	require.NoError(t, err)
	return write(t, string(b))
}

// The Host refuses a runtimeUrl that would carry the admin token and secret deliveries in clear
// over a network (SPEC 5.1, control channel), naming the installation; loopback http stays the dev
// default.
func TestACleartextRuntimeURLOffLoopbackIsRefused(t *testing.T) {
	t.Parallel()
	for _, u := range []string{"http://10.0.0.2:8788", "http://runtime.internal:8788", "http://[2001:db8::1]:8788", "http://0.0.0.0:8788"} {
		_, err := Load(selfhostCatalog(t, map[string]string{"runtimeUrl": u}))
		require.ErrorContains(t, err, `installation "node-7": runtimeUrl "`+u+`" is http:// to a host that is not loopback`)
	}
	for _, u := range []string{"http://127.0.0.1:8788", "http://127.0.0.2:8788", "http://localhost:8788", "http://[::1]:8788", "https://10.0.0.2:8788", "https://runtime.internal"} {
		_, err := Load(selfhostCatalog(t, map[string]string{"runtimeUrl": u}))
		require.NoError(t, err, u)
	}
}

// runtimeCaFile and a client certificate are read when the catalog loads, need https, and go
// with a selfhost installation only.
func TestRuntimeTLSFilesAreCheckedWhenTheCatalogLoads(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "runtime")
	client := testpki.NewCA(t, "hosts").Client(t, "host")
	notPEM := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(notPEM, []byte("not a certificate"), 0o600))

	good := map[string]string{"runtimeUrl": "https://10.0.0.2:8788", "runtimeCaFile": ca.CertFile,
		"runtimeClientCertFile": client.CertFile, "runtimeClientKeyFile": client.KeyFile}
	c, err := Load(selfhostCatalog(t, good))
	require.NoError(t, err)
	require.Equal(t, ca.CertFile, c.Installations["node-7"].RuntimeCAFile)
	require.Equal(t, client.KeyFile, c.Installations["node-7"].RuntimeClientKeyFile)

	cases := map[string]struct {
		set  map[string]string
		want string
	}{
		"CA over http":        {map[string]string{"runtimeUrl": "http://127.0.0.1:8788", "runtimeCaFile": ca.CertFile}, "need an https:// runtimeUrl"},
		"missing CA":          {map[string]string{"runtimeUrl": "https://h.example", "runtimeCaFile": filepath.Join(t.TempDir(), "absent.pem")}, "runtimeCaFile: open"},
		"CA not PEM":          {map[string]string{"runtimeUrl": "https://h.example", "runtimeCaFile": notPEM}, "holds no PEM certificate"},
		"cert without key":    {map[string]string{"runtimeUrl": "https://h.example", "runtimeClientCertFile": client.CertFile}, "go together"},
		"key of another cert": {map[string]string{"runtimeUrl": "https://h.example", "runtimeClientCertFile": client.CertFile, "runtimeClientKeyFile": notPEM}, "runtimeClientCertFile and runtimeClientKeyFile:"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Load(selfhostCatalog(t, tc.set))
			require.ErrorContains(t, err, `installation "node-7": `)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err = Load(write(t, `{"installations":[{"name":"x","pack":"workers-dev","accountSubdomain":"a","runtimeCaFile":"`+ca.CertFile+`"}]}`))
	require.ErrorContains(t, err, "belong to selfhost installations")
}

// The control channel's credentials are not placement: naming a CA or a client certificate, or
// moving their files, changes no offering digest, so nothing placed on the node drifts when its
// certificates are rotated. (Nor does its runtimeUrl, the pool's first node: SPEC 6.2.)
func TestRuntimeTLSFilesChangeNoOfferingDigest(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "runtime")
	other := testpki.NewCA(t, "renewed")
	client := testpki.NewCA(t, "hosts").Client(t, "host")
	digest := func(set map[string]string) string {
		c, err := Load(selfhostCatalog(t, set))
		require.NoError(t, err)
		return c.Offerings[0].Digest
	}
	plain := digest(map[string]string{"runtimeUrl": "https://10.0.0.2:8788"})
	require.Equal(t, plain, digest(map[string]string{"runtimeUrl": "https://10.0.0.2:8788", "runtimeCaFile": ca.CertFile}))
	require.Equal(t, plain, digest(map[string]string{"runtimeUrl": "https://10.0.0.2:8788", "runtimeCaFile": other.CertFile,
		"runtimeClientCertFile": client.CertFile, "runtimeClientKeyFile": client.KeyFile}))
	require.Equal(t, plain, digest(map[string]string{"runtimeUrl": "https://10.0.0.3:8788"}))
}

// A pool's public key is checked when the catalog loads, belongs to selfhost, and moves no
// offering digest: naming one, or rotating it, strands no worker.
func TestPoolPublicKeyIsCheckedAndMovesNoOfferingDigest(t *testing.T) {
	t.Parallel()
	key := func() string {
		p, err := poolkey.Generate("local")
		require.NoError(t, err)
		return p.Public().String()
	}
	digest := func(set map[string]string) string {
		c, err := Load(selfhostCatalog(t, set))
		require.NoError(t, err)
		return c.Offerings[0].Digest
	}
	plain := digest(nil)
	require.Equal(t, plain, digest(map[string]string{"poolPublicKey": key()}))
	require.Equal(t, plain, digest(map[string]string{"poolPublicKey": key()}), "a rotated key")
	_, err := Load(selfhostCatalog(t, map[string]string{"poolPublicKey": "x25519:AAAA"}))
	require.ErrorContains(t, err, "poolPublicKey")
}
