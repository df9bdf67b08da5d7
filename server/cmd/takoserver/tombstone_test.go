package main_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// TestServeKeepsTombstonesThirtyDaysByDefault: `takoserver serve` given no --tombstone-retention
// keeps a deleted object's tombstone for 30 days (SPEC 3.2; the server's own default is
// TestRuleTombstonesAreKeptThirtyDaysByDefault's).
func TestServeKeepsTombstonesThirtyDaysByDefault(t *testing.T) {
	t.Parallel()
	url, key := migratedWithKey(t)
	h := startHost(t, url, sealingKey(t))

	path := h.url + "/v1/worker-endpoint-origin-reservations/res-api"
	status, res := call(t, http.MethodPut, path, key, "token-tombstone-0001", `{"space":"prod","workerName":"api"}`)
	require.Equal(t, http.StatusCreated, status, "%v", res)
	status, res = call(t, http.MethodDelete, path, key, "token-tombstone-0001", "")
	require.Equal(t, http.StatusOK, status, "%v", res)

	db, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	var kept float64
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT extract(epoch FROM expires_at - deleted_at) FROM ownership_tombstones WHERE token = 'token-tombstone-0001'`).Scan(&kept))
	require.Equal(t, float64(30*24*60*60), kept, "seconds the tombstone is kept")
}
