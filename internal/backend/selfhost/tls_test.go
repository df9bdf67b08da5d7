package selfhost_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// statusWith reads a node's status through a client built from cfg, trying once.
func statusWith(t *testing.T, cfg selfhost.Config) error {
	t.Helper()
	c, err := selfhost.NewFromConfig(cfg)
	if err != nil {
		return err
	}
	c.Attempts = 1
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = c.Status(ctx)
	return err
}

// The control channel over TLS (SPEC 5.1): the Host trusts a runtime's admin certificate through
// the private CA it names and no other, and a runtime that requires client certificates serves
// only a Host presenting one its CA issued.
func TestTheAdminAPIOverTLSWithAPrivateCAAndMutualTLS(t *testing.T) {
	t.Parallel()
	runtimeCA := testpki.NewCA(t, "runtime")
	serverPair := runtimeCA.Server(t, "runtime-admin", "127.0.0.1")
	hostCA := testpki.NewCA(t, "hosts")
	hostPair := hostCA.Client(t, "host-1")
	stranger := testpki.NewCA(t, "stranger")
	strangerPair := stranger.Client(t, "stranger-host")

	h := runtimetest.Start(t, func(cfg *runtime.Config) {
		cfg.AdminTLSCert, cfg.AdminTLSKey = serverPair.CertFile, serverPair.KeyFile
	})
	require.Regexp(t, `^https://127\.0\.0\.1:\d+$`, h.Info.AdminURL)
	base := selfhost.Config{URL: h.Info.AdminURL, TokenFile: h.Info.TokenFile}

	withCA := base
	withCA.CAFile = runtimeCA.CertFile
	require.NoError(t, statusWith(t, withCA), "https with the private CA that issued the runtime's certificate")

	otherCA := base
	otherCA.CAFile = stranger.CertFile
	err := statusWith(t, otherCA)
	require.ErrorIs(t, err, selfhost.ErrNodeUnreachable)
	require.ErrorContains(t, err, "unknown authority", "a certificate from another CA is not trusted")
	require.ErrorContains(t, statusWith(t, base), "unknown authority", "nor through the system's roots")

	// Mutual TLS: the runtime asks for a client certificate of the Hosts' CA.
	m := runtimetest.Start(t, func(cfg *runtime.Config) {
		cfg.AdminTLSCert, cfg.AdminTLSKey, cfg.AdminClientCA = serverPair.CertFile, serverPair.KeyFile, hostCA.CertFile
	})
	mutual := selfhost.Config{URL: m.Info.AdminURL, TokenFile: m.Info.TokenFile, CAFile: runtimeCA.CertFile}
	err = statusWith(t, mutual)
	require.ErrorIs(t, err, selfhost.ErrNodeUnreachable)
	require.ErrorContains(t, err, "certificate required", "no client certificate: refused in the handshake")

	withStranger := mutual
	withStranger.ClientCertFile, withStranger.ClientKeyFile = strangerPair.CertFile, strangerPair.KeyFile
	require.ErrorIs(t, statusWith(t, withStranger), selfhost.ErrNodeUnreachable, "a client certificate of another CA is refused")

	withHost := mutual
	withHost.ClientCertFile, withHost.ClientKeyFile = hostPair.CertFile, hostPair.KeyFile
	require.NoError(t, statusWith(t, withHost), "the Host's client certificate opens the channel")
}

// The client never sends the admin token in clear to a host that is not loopback, and TLS settings
// need https.
func TestTheClientRefusesACleartextChannelOffLoopback(t *testing.T) {
	t.Parallel()
	h := runtimetest.Start(t)
	for _, u := range []string{"http://192.0.2.10:8788", "http://runtime.internal:8788", "http://[2001:db8::1]:8788"} {
		err := statusWith(t, selfhost.Config{URL: u, TokenFile: h.Info.TokenFile})
		require.ErrorContains(t, err, "in clear", u)
	}
	require.NoError(t, statusWith(t, selfhost.Config{URL: h.Info.AdminURL, TokenFile: h.Info.TokenFile}), "loopback http is the dev default")
	ca := testpki.NewCA(t, "any")
	err := statusWith(t, selfhost.Config{URL: h.Info.AdminURL, TokenFile: h.Info.TokenFile, CAFile: ca.CertFile})
	require.ErrorContains(t, err, "needs an https:// runtime URL")
}
