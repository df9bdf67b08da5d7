package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

const tokenA = "token-aaaaaaaaaaaaaaaa"
const tokenB = "token-bbbbbbbbbbbbbbbb"

func TestOwnershipReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	require.Empty(t, first.header.Get("Takoform-Replayed"))

	// The same request, formatted differently, is the same request.
	again := h.putReservation(h.key, "res-a", tokenA, "{ \"workerName\": \"api\",\n \"space\": \"prod\" }")
	require.Equal(t, http.StatusCreated, again.status)
	require.Equal(t, "true", again.header.Get("Takoform-Replayed"))
	require.Equal(t, first.body, again.body, "a replay returns the stored response byte for byte")
	require.Equal(t, 1, h.rowCount("true"))
	require.EqualValues(t, 1, first.json(t)["revision"])
}

func TestOwnershipConflictNamesTheObjectAndImport(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, created.status)

	p := h.putReservation(h.key, "res-a", tokenB, apiBody("prod", "api")).problem(t, http.StatusConflict, "ownership_conflict")
	conflict := p["conflict"].(map[string]any)
	require.Equal(t, "res-a", conflict["id"])
	require.Contains(t, conflict["importCommand"], "import takoform_worker_endpoint_origin_reservation.")
	require.Contains(t, conflict["importCommand"], "res-a")

	h.deleteReservation(h.key, "res-a", tokenB).problem(t, http.StatusConflict, "ownership_conflict")
	require.Equal(t, "prepared", h.getReservation(h.key, "res-a").json(t)["status"], "a wrong token deletes nothing")
}

func TestOwnershipGetReturnsTokenForImport(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, tokenA, h.getReservation(h.key, "res-a").json(t)["ownershipToken"])
}

func TestOwnershipSameTokenNewIntentIsAnUpdate(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, first.status)

	// A new request hash that resolves to what is held (the default TTL spelled out) succeeds.
	explicit := map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": 86400}
	r := h.putReservation(h.key, "res-a", tokenA, explicit)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	require.Empty(t, r.header.Get("Takoform-Replayed"))
	require.Equal(t, first.json(t)["canonicalOrigin"], r.json(t)["canonicalOrigin"])
	// ... and is now the stored intent.
	require.Equal(t, "true", h.putReservation(h.key, "res-a", tokenA, explicit).header.Get("Takoform-Replayed"))

	// One that asks for something else is refused, and changes nothing.
	moved := map[string]any{"space": "prod", "workerName": "api", "subdomain": "elsewhere"}
	p := h.putReservation(h.key, "res-a", tokenA, moved).problem(t, http.StatusConflict, "reservation_mismatch")
	require.Contains(t, p["mismatch"], "subdomain")
	require.Equal(t, first.json(t)["canonicalOrigin"], h.getReservation(h.key, "res-a").json(t)["canonicalOrigin"])
	require.Equal(t, 1, h.rowCount("true"))
}

func TestOwnershipInFlightRequestAnswersInProgress(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.lockWait = 200 * time.Millisecond })
	ctx := context.Background()
	// Hold the object's lock the way an in-flight request does.
	tx, err := h.db.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", h.org.ID+"/worker-endpoint-origin-reservation/res-a")
	require.NoError(t, err)

	h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).problem(t, http.StatusConflict, "intent_in_progress")
	require.Zero(t, h.rowCount("true"))

	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status, "retrying after the other request ends succeeds")
}

func TestOwnershipDeleteLeavesTombstone(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, created.status)

	deleted := h.deleteReservation(h.key, "res-a", tokenA)
	require.Equal(t, http.StatusOK, deleted.status, "body: %s", deleted.body)
	require.Equal(t, "released", deleted.json(t)["status"])
	h.getReservation(h.key, "res-a").problem(t, http.StatusNotFound, "not_found")

	// A replayed DELETE answers as the first did.
	replay := h.deleteReservation(h.key, "res-a", tokenA)
	require.Equal(t, deleted.status, replay.status)
	require.Equal(t, deleted.body, replay.body)
	require.Equal(t, "true", replay.header.Get("Takoform-Replayed"))

	// A late replay of the create never resurrects the object.
	h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).problem(t, http.StatusGone, "tombstoned")
	h.getReservation(h.key, "res-a").problem(t, http.StatusNotFound, "not_found")

	// A new token creates the key again, as a new object with a new UID.
	var oldUID string
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT object_uid::text FROM ownership_tombstones WHERE token = $1", tokenA).Scan(&oldUID))
	again := h.putReservation(h.key, "res-a", tokenB, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	var newUID string
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT uid::text FROM worker_endpoint_origin_reservations WHERE id = 'res-a'").Scan(&newUID))
	require.NotEqual(t, oldUID, newUID)
	require.Equal(t, tokenB, h.getReservation(h.key, "res-a").json(t)["ownershipToken"])
}

func TestOwnershipTokenIsRequired(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)
	h.deleteReservation(h.key, "res-a", "").problem(t, http.StatusPreconditionRequired, "ownership_token_required")
	h.putReservation(h.key, "res-b", "", apiBody("prod", "web")).problem(t, http.StatusPreconditionRequired, "ownership_token_required")
	h.putReservation(h.key, "res-b", "short", apiBody("prod", "web")).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	h.putReservation(h.key, "res-b", "token with spaces!!!!!", apiBody("prod", "web")).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	require.Equal(t, 1, h.rowCount("true"))
}

func TestOwnershipExpiredTombstoneNoLongerRefuses(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-a", tokenA).status)
	_, err := h.db.Exec(context.Background(), "UPDATE ownership_tombstones SET expires_at = now() - interval '1 second'")
	require.NoError(t, err)

	// Past its retention a tombstone is ignored, and purged by the janitor's query.
	h.deleteReservation(h.key, "res-a", tokenA).problem(t, http.StatusNotFound, "not_found")
	n, err := (&ownership.Manager{DB: h.db}).PurgeTombstones(context.Background())
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var left int
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM ownership_tombstones").Scan(&left))
	require.Zero(t, left)
}
