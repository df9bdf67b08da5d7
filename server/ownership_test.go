package server_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"

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

// holdingBackend holds every Apply of a native object named in hold until released, so that a
// real request stays in flight while a test sends others.
type holdingBackend struct {
	backend.Mutator
	mu      sync.Mutex
	hold    map[string]chan struct{}
	fail    map[string]bool
	entered chan string
}

func (b *holdingBackend) Unwrap() backend.Mutator { return b.Mutator }

func (b *holdingBackend) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	b.mu.Lock()
	ch, fail := b.hold[d.NativeName], b.fail[d.NativeName]
	delete(b.fail, d.NativeName)
	b.mu.Unlock()
	if fail {
		return backend.Observation{}, errors.New("the backend refused the call (test)")
	}
	if ch != nil {
		b.entered <- d.NativeName
		<-ch
	}
	return b.Mutator.Apply(ctx, d)
}

// failNext makes the next Apply of native fail before it reaches the backend.
func (b *holdingBackend) failNext(native string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.fail[native] = true
}

func holding() (*holdingBackend, func(*options)) {
	hb := &holdingBackend{hold: map[string]chan struct{}{}, fail: map[string]bool{}, entered: make(chan string, 8)}
	return hb, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { hb.Mutator = m; return hb }
	}
}

func (b *holdingBackend) holdNext(native string) chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	ch := make(chan struct{})
	b.hold[native] = ch
	return ch
}

// TestOwnershipInFlightRequestAnswersInProgress: while a real request holds a key (its backend
// call is under way), another request on the key gets a retryable 409 intent_in_progress with
// Retry-After, whatever its token; a replay of a request that already finished is answered from
// its stored response without waiting; and once the first request ends, the retry succeeds.
func TestOwnershipInFlightRequestAnswersInProgress(t *testing.T) {
	t.Parallel()
	hb, wrap := holding()
	h := setup(t, wrap, func(o *options) { o.busyWait = 100 * time.Millisecond })
	created := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	script := created.json(t)["scriptName"].(string)

	release := hb.holdNext(script)
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	update := workerBody()
	update["compatibilityDate"] = "2025-03-03"
	done := make(chan reply, 1)
	go func() { done <- h.tryPutWorker("prod", "api", workerToken, update) }()
	require.Equal(t, script, <-hb.entered, "the update is in flight, inside its backend call")

	other := workerBody()
	other["compatibilityDate"] = "2025-04-04"
	busy := h.putWorker("prod", "api", workerToken, other)
	busy.problem(t, http.StatusConflict, "intent_in_progress")
	require.Equal(t, "1", busy.header.Get("Retry-After"))
	h.putWorker("prod", "api", "another-token-0123456789", other).problem(t, http.StatusConflict, "ownership_conflict")

	replay := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, replay.status, "the finished create replays while the update is in flight")
	require.Equal(t, created.body, replay.body)
	require.Equal(t, "true", replay.header.Get("Takoform-Replayed"))

	once.Do(func() { close(release) })
	first := <-done
	require.Equal(t, http.StatusOK, first.status, "body: %s", first.body)
	second := h.putWorker("prod", "api", workerToken, other)
	require.Equal(t, http.StatusOK, second.status, "retrying after the other request ends succeeds: %s", second.body)
	require.Equal(t, "2025-04-04", second.json(t)["compatibilityDate"])
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
