package packs_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/packs"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// Only a runtime node keeps its workers' logs: the Cloudflare packs have no log source, and say so
// with backend.ErrNotImplemented rather than an empty log.
func TestOnlySelfhostOffersWorkerLogs(t *testing.T) {
	t.Parallel()
	r := packs.Registry()
	src, err := r.LogSource(catalog.Installation{Name: "local", Pack: catalog.PackSelfhost, RuntimeURL: "http://127.0.0.1:1", RuntimeTokenFile: "/nonexistent"})
	require.NoError(t, err)
	require.NotNil(t, src)
	for _, pack := range []string{catalog.PackWorkersDev, catalog.PackWFPManaged} {
		_, err := r.LogSource(catalog.Installation{Name: "cf", Pack: pack})
		require.ErrorIs(t, err, backend.ErrNotImplemented, pack)
	}
}
