package server_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// A member another replica adds to the pool while a delete runs (after this Host read the pool)
// holds the deletion open: the closure reads the membership rows in the same statement as the
// members' confirmations (SPEC 6.2), so the delete answers 503 naming the member, the endpoint's
// deployment stays deleting and its attestation open. Once that member is retired as lost, the
// retry closes them. Each member's part is an effect of its own in the ledger.
func TestAMemberAddedWhileADeleteRanHoldsTheAttestationOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := &routeWatcher{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { w.Mutator = m; return w }
	})
	// The catalog's node as the pool's one membership row, joined long ago.
	_, err := h.db.Exec(ctx, `INSERT INTO runtime_nodes (installation, name, url, state, added_at, changed_at)
		VALUES ('selfhost', 'node-1', $1, 'serving', now() - interval '1 hour', now() - interval '1 hour')`, h.runtime.Info.AdminURL)
	require.NoError(t, err)

	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	host, uid := e["hostname"].(string), e["uid"].(string)
	status, _, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status)
	var applied string
	require.NoError(t, h.db.QueryRow(ctx, `SELECT string_agg(c.node || ':' || c.status::text, ',')
		FROM backend_effects c JOIN deployments d ON d.id = c.deployment_id
		WHERE d.resource_uid = $1 AND c.action = 'apply' AND c.parent_id IS NOT NULL`, uid).Scan(&applied))
	require.Equal(t, "node-1:succeeded", applied, "the endpoint's apply is one effect on its pool's one member")

	// node-2 joins once the route is gone from node-1 and before the delete records it: this
	// Host's read of the pool did not have it, so it was never asked.
	w.mu.Lock()
	w.afterDelete = func(backend.Desired) {
		_, err := h.db.Exec(context.Background(), `INSERT INTO runtime_nodes (installation, name, url, state, added_at, changed_at)
			VALUES ('selfhost', 'node-2', 'http://127.0.0.1:9', 'joining', now(), now())`)
		if err != nil {
			panic(err)
		}
	}
	w.mu.Unlock()
	r := h.deleteEndpoint("prod", "api", endpointToken)
	p := r.problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Contains(t, p["detail"], "node node-2 of the pool was not asked to confirm the deletion")
	require.Equal(t, "open", h.attestation(uid))
	require.Equal(t, 1, count(t, h, `deployments WHERE resource_uid = $1 AND status = 'deleting'`, uid))
	var deleted string
	require.NoError(t, h.db.QueryRow(ctx, `SELECT string_agg(c.node || ':' || c.status::text, ',')
		FROM backend_effects c JOIN deployments d ON d.id = c.deployment_id
		WHERE d.resource_uid = $1 AND c.action = 'delete' AND c.parent_id IS NOT NULL`, uid).Scan(&deleted))
	require.Equal(t, "node-1:succeeded", deleted)

	// node-2 is lost for good: retired (fenced an hour ago), its absence counts as confirmed.
	w.mu.Lock()
	w.afterDelete = nil
	w.mu.Unlock()
	_, err = h.db.Exec(ctx, `UPDATE runtime_nodes SET state = 'retired', fenced_since = now() - interval '1 hour' WHERE name = 'node-2'`)
	require.NoError(t, err)
	r = h.deleteEndpoint("prod", "api", endpointToken)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Equal(t, "closed", h.attestation(uid))
	require.Zero(t, count(t, h, `deployments WHERE resource_uid = $1 AND status NOT IN ('deleted', 'failed')`, uid))
}

// count counts the rows of a table's where clause.
func count(t *testing.T, h *harness, where string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM "+where, args...).Scan(&n))
	return n
}
