package selfhost

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// The selfhost backend reaches its runtime node through the installation's TLS settings: with
// the runtime's private CA and the Host's client certificate it observes the node; without the
// certificate the node refuses it and the backend reports the node unreachable.
func TestTheSelfhostBackendUsesTheInstallationsCAAndClientCertificate(t *testing.T) {
	t.Parallel()
	runtimeCA := testpki.NewCA(t, "runtime")
	serverPair := runtimeCA.Server(t, "runtime-admin", "127.0.0.1")
	hostCA := testpki.NewCA(t, "hosts")
	hostPair := hostCA.Client(t, "host")
	node := runtimetest.Start(t, func(cfg *runtime.Config) {
		cfg.AdminTLSCert, cfg.AdminTLSKey, cfg.AdminClientCA = serverPair.CertFile, serverPair.KeyFile, hostCA.CertFile
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	inst := catalog.Installation{Name: "tls-node", Pack: catalog.PackSelfhost, RuntimeURL: node.Info.AdminURL, RuntimeTokenFile: node.Info.TokenFile,
		RuntimeCAFile: runtimeCA.CertFile, RuntimeClientCertFile: hostPair.CertFile, RuntimeClientKeyFile: hostPair.KeyFile}

	reg := backend.Registry{Packs: map[string]backend.Pack{catalog.PackSelfhost: NewMutator}}
	m, err := reg.Mutator(inst)
	require.NoError(t, err)
	obs, err := m.(*pool).Observe(ctx, backend.NativeWorker, "nothing-here")
	require.NoError(t, err)
	require.False(t, obs.Present)

	inst.RuntimeClientCertFile, inst.RuntimeClientKeyFile = "", ""
	m, err = reg.Mutator(inst)
	require.NoError(t, err)
	_, err = m.(*pool).Observe(ctx, backend.NativeWorker, "nothing-here")
	require.ErrorIs(t, err, backend.ErrUnreachable)
	require.ErrorContains(t, err, "certificate required")
}
