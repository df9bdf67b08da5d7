package backend

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

func TestPacksDeriveFromTheSharedFormulas(t *testing.T) {
	t.Parallel()
	v := loadVectors(t)[0]
	w := WorkerRef{TenantRef: v.TenantRef, Space: v.Space, Name: v.WorkerName, UID: v.WorkerUID}

	self, err := For(catalog.Default().Installations["selfhost"])
	require.NoError(t, err)
	label, ok := self.HostMintedSubdomain(w)
	require.True(t, ok)
	require.Equal(t, v.ScriptNameV2, label)
	require.Equal(t, v.ScriptNameV2, self.DefaultLabel(w))
	require.Equal(t, "http://"+v.ScriptNameV2+".workers.localhost:8787", self.CanonicalOrigin(self.DefaultLabel(w)))

	dev, err := For(catalog.Installation{Name: "cf", Pack: catalog.PackWorkersDev, AccountSubdomain: "acme"})
	require.NoError(t, err)
	label, ok = dev.HostMintedSubdomain(w)
	require.True(t, ok)
	require.Equal(t, v.ScriptNameV2, label)
	require.Equal(t, "https://"+v.ScriptNameV2+".acme.workers.dev", dev.CanonicalOrigin(label))

	wfp, err := For(catalog.Installation{Name: "wfp", Pack: catalog.PackWFPManaged, BaseDomain: "edge.example.com"})
	require.NoError(t, err)
	_, ok = wfp.HostMintedSubdomain(w)
	require.False(t, ok, "a backend that sells its base domain mints no script-named label")
	require.Equal(t, v.ManagedDefaultLabel, wfp.DefaultLabel(w))
	require.Equal(t, "https://"+v.ManagedDefaultLabel+".edge.example.com", wfp.CanonicalOrigin(wfp.DefaultLabel(w)))
	require.Equal(t, v.ScriptNameV2, wfp.ScriptName(w))
}

func TestSelfhostOriginOmitsDefaultPort(t *testing.T) {
	t.Parallel()
	b, err := For(catalog.Installation{Name: "s", Pack: catalog.PackSelfhost, EndpointSuffix: "w.example.test", EdgeListen: "0.0.0.0:443", Scheme: "https"})
	require.NoError(t, err)
	require.Equal(t, "https://x.w.example.test", b.CanonicalOrigin("x"))
}
