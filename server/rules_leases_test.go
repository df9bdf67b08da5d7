package server_test

// Rules of the runtime-input lease (SPEC 3.5) that stood only because a second layer, or the
// provider, also held them (issue 35): each test here takes the other layer out of the way, so
// that it fails when its one rule is removed.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// preparationRow is what a refused claim or delivery must leave as it was.
type preparationRow struct {
	Status    string
	Epoch     int64
	WorkerUID *uuid.UUID
}

func (h *harness) preparationRow(op string) preparationRow {
	h.t.Helper()
	var p preparationRow
	require.NoError(h.t, h.db.QueryRow(context.Background(),
		`SELECT status::text, epoch, worker_uid FROM runtime_input_preparations WHERE operation_id = $1`, op).Scan(&p.Status, &p.Epoch, &p.WorkerUID))
	return p
}

// TestRuleAReplacedWorkerNamingAnInputSettledForTheOldUIDIsRefused: "A preparation is delivered
// once, to one worker UID ... a new worker UID (a replaced worker) needs a new runtime input, and a
// worker PUT naming a preparation settled for another UID answers 409 lease_unavailable saying so."
// The Host's own refusal, not the provider's plan-time diagnostic: a worker deleted and created
// again under a new UID, naming the input its old incarnation settled, is refused and changes
// nothing; with a new runtime input it is taken.
func TestRuleAReplacedWorkerNamingAnInputSettledForTheOldUIDIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	old := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, old.status, "body: %s", old.body)
	oldUID := uuid.MustParse(old.json(t)["uid"].(string))
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	require.Equal(t, "closed", h.status(`SELECT status FROM deletion_attestations WHERE uid = $1`, oldUID), "the old worker is provably gone")
	settled := h.preparationRow("op-1")
	require.Equal(t, preparationRow{Status: "settled", Epoch: settled.Epoch, WorkerUID: &oldUID}, settled)
	reservation := h.getReservation(h.key, "res-api").json(t)

	// The worker created again, under a new UID, naming the old input.
	r := h.putWorker("prod", "api", "token-worker-0000000002", secretWorkerBody(p.reference))
	prob := r.problem(t, http.StatusConflict, "lease_unavailable")
	require.Contains(t, prob["detail"], "delivered to another worker")
	require.Contains(t, prob["detail"], oldUID.String())
	require.NotContains(t, string(r.body), secretCanary)

	// Nothing changed: the input stays settled for the old UID, no worker stands under the name,
	// and the reservation was not moved to the refused incarnation.
	require.Equal(t, settled, h.preparationRow("op-1"))
	require.Zero(t, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`), "the refused worker never committed")
	h.get("/v1/spaces/prod/workers/api").problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, reservation["revision"], h.getReservation(h.key, "res-api").json(t)["revision"])
	require.Equal(t, oldUID.String(), h.getReservation(h.key, "res-api").json(t)["boundWorker"].(map[string]any)["uid"])

	// The replaced worker with a runtime input of its own is taken, and reads Ready.
	p2 := h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, p2.reply.status, "body: %s", p2.reply.body)
	w := h.putWorker("prod", "api", "token-worker-0000000003", secretWorkerBody(p2.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	require.Equal(t, true, w.json(t)["ready"])
	require.NotEqual(t, oldUID.String(), w.json(t)["uid"])
	require.Equal(t, settled, h.preparationRow("op-1"), "the old input still belongs to the old UID")
}

// acquireTracer watches the Host's connections for the claim statement (PreparationAcquire), counts
// it, and makes the statement's one-claim clause hold right before it runs, in the same transaction: the claim it finds on the row is rewritten to the claimant's UID, as if that claim
// were the claimant's own. So the SQL compare-and-swap lets a second claim through, and only the
// Go check before it stands in the way.
type acquireTracer struct {
	mu  sync.Mutex
	ran int
	err error
}

const acquireStatement = "-- name: PreparationAcquire :one"

func (a *acquireTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if !strings.HasPrefix(data.SQL, acquireStatement) {
		return ctx
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ran++
	if a.err == nil {
		// $2 is the claimant's worker UID; $5 and $6 the organization and operation.
		_, a.err = conn.Exec(ctx, `UPDATE runtime_input_preparations SET worker_uid = $1
			WHERE organization_id = $2 AND operation_id = $3 AND status = 'claimed'`, data.Args[1], data.Args[4], data.Args[5])
	}
	return ctx
}

func (a *acquireTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (a *acquireTracer) result() (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ran, a.err
}

// TestRuleTheGoCheckAloneRefusesASecondClaim: one claim per preparation (SPEC 3.5: "nobody else
// gets a second claim"), in the Go check before the claim statement. Another incarnation holds the
// claim on a live reservation's input, and a worker is created consuming it: every other check
// holds (reference, target, binding names, the reservation free to bind), and the claim
// statement's own one-claim clause is cleared right before it would run. The Go check alone
// refuses: 409 lease_unavailable, the statement never runs, the other incarnation keeps its claim,
// and neither the worker nor a binding of the reservation to it commits.
func TestRuleTheGoCheckAloneRefusesASecondClaim(t *testing.T) {
	t.Parallel()
	tracer := &acquireTracer{}
	h := setup(t, func(o *options) { o.tracer = tracer })
	p := h.reservedAndPrepared()
	// Another incarnation holds the claim.
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', epoch = epoch + 1, worker_uid = $1, worker_revision = 1,
		claimed_at = now(), claim_expires_at = now() + interval '15 minutes'`, uuid.New())
	held := h.preparationRow("op-1")

	r := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	prob := r.problem(t, http.StatusConflict, "lease_unavailable")
	require.Contains(t, prob["detail"], "is claimed")
	ran, err := tracer.result()
	require.NoError(t, err)
	require.Zero(t, ran, "the Go check refused before the claim statement ran")
	require.Equal(t, held, h.preparationRow("op-1"), "the other incarnation keeps its claim")
	require.Zero(t, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`), "the refused worker never committed")
	require.Equal(t, "prepared", h.getReservation(h.key, "res-api").json(t)["status"], "the reservation was bound to nobody")
}

// TestRuleTheClaimStatementAloneRefusesASecondClaim: one claim per preparation (SPEC 3.5), in the
// claim statement's compare-and-swap, with the Go check out of the way (the statement is called
// directly). Another incarnation holds the claim; the claimant is live at its revision with the
// reservation bound to it, so every other clause of the statement holds: the statement claims
// nothing and leaves the row as it was. The same call succeeds once the claim on the row is the
// claimant's own, which shows the one-claim clause was what refused.
func TestRuleTheClaimStatementAloneRefusesASecondClaim(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	w := h.mustWorker("prod", "api", workerToken)
	h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	uid := uuid.MustParse(w["uid"].(string))
	revision := int64(w["revision"].(float64))
	script := w["scriptName"].(string)
	other := uuid.New()
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', epoch = epoch + 1, worker_uid = $1, worker_revision = 1,
		claimed_at = now(), claim_expires_at = now() + interval '15 minutes'`, other)
	held := h.preparationRow("op-1")

	acquire := func() error {
		_, err := dbsqlc.New(h.db).PreparationAcquire(context.Background(), dbsqlc.PreparationAcquireParams{
			OrganizationID: h.org.ID, OperationID: "op-1", Epoch: h.preparationRow("op-1").Epoch, Reference: p.reference,
			Space: "prod", WorkerName: "api", WorkerUID: &uid, WorkerRevision: &revision, NativeName: &script,
		})
		return err
	}
	err := acquire()
	require.True(t, errors.Is(err, pgx.ErrNoRows), "a second claim must be refused, got %v", err)
	require.Equal(t, held, h.preparationRow("op-1"), "the other incarnation keeps its claim")

	// The claim on the row made the claimant's own: the same statement takes it (its retry).
	h.exec(`UPDATE runtime_input_preparations SET worker_uid = $1`, uid)
	require.NoError(t, acquire(), "every other clause of the statement holds")
	require.Equal(t, "claimed", h.preparationStatus("op-1"))
}

// TestRuleAnUpdateRefusedForItsRuntimeInputChangesNothing: a worker put refused for its runtime
// input changes and deploys nothing (SPEC 3.5; a bad input changes nothing). A standing worker is
// updated to name the input its deleted predecessor settled: the update is refused with 409
// lease_unavailable before it writes a generation or deploys one, so the worker keeps its
// revision, its code, its own input and its Ready, and the plan that reads it back still sees the
// change to make.
func TestRuleAnUpdateRefusedForItsRuntimeInputChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p1 := h.reservedAndPrepared()
	old := h.putWorker("prod", "api", workerToken, secretWorkerBody(p1.reference))
	require.Equal(t, http.StatusCreated, old.status, "body: %s", old.body)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	p2 := h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, p2.reply.status, "body: %s", p2.reply.body)
	w := h.putWorker("prod", "api", "token-worker-0000000002", secretWorkerBody(p2.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	before := w.json(t)
	uid := before["uid"].(string)
	deployments := h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1`, uid)

	body := secretWorkerBody(p1.reference)
	body["modules"] = map[string]string{"index.js": `export default { fetch() { return new Response("v2") } }`}
	r := h.putWorker("prod", "api", "token-worker-0000000002", body)
	prob := r.problem(t, http.StatusConflict, "lease_unavailable")
	require.Contains(t, prob["detail"], "delivered to another worker")

	after := h.get("/v1/spaces/prod/workers/api").json(t)
	for _, field := range []string{"revision", "generation", "modules", "runtimeInputs", "ready"} {
		require.Equal(t, before[field], after[field], "%s changed by a refused update", field)
	}
	require.Equal(t, deployments, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1`, uid), "a refused update deploys nothing")
}
