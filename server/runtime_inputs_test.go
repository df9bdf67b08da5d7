package server_test

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const secretCanary = "tk-canary-9d31f7a0c2e4b"

func prepPath(org, op string) string {
	return "/v1/organizations/" + org + "/worker-runtime-input-preparations/" + op
}

// prepared is a runtime input made the way the provider makes one: the reference computed by the
// caller from the nonce, target, reservation origin and values.
type prepared struct {
	operationID string
	reference   string
	reply       reply
}

func (h *harness) prepare(op, token, reservationID, space, worker string, bindings map[string]string) prepared {
	h.t.Helper()
	return h.prepareAs(h.key, h.org.ID, op, token, reservationID, space, worker, bindings)
}

// prepareAs is prepare for the organization orgID, with its key.
func (h *harness) prepareAs(key, orgID, op, token, reservationID, space, worker string, bindings map[string]string) prepared {
	h.t.Helper()
	res := h.getReservation(key, reservationID).json(h.t)
	return h.prepareOn(key, orgID, op, token, reservationID, res["canonicalOrigin"].(string), space, worker, bindings)
}

// prepareOn is prepareAs with the reservation's canonical origin given, for a reservation that
// no longer reads (a released one).
func (h *harness) prepareOn(key, orgID, op, token, reservationID, origin, space, worker string, bindings map[string]string) prepared {
	h.t.Helper()
	secrets := map[string]vocab.Secret{}
	for k, v := range bindings {
		secrets[k] = vocab.NewSecret(v)
	}
	nonce := "nonce-" + op
	target := runtimeinput.Target{Space: space, WorkerName: worker, BundleName: "main", EndpointName: worker,
		OriginReservationID: reservationID, CanonicalPublicOrigin: origin}
	// As the provider does: a rip2 reference under the commitment key the Host gives a write key.
	ck := h.commitmentKey(key, nonce)
	id := runtimeref.DeriveV2(ck.key, ck.secretID, nonce, target, bindings)
	return prepared{operationID: op, reference: id.Reference, reply: h.do(req{method: http.MethodPut, path: prepPath(orgID, op), key: key, token: token,
		body: map[string]any{
			"format": runtimeinput.PreparationFormat, "materialSetNonce": nonce, "runtimeInputReference": id.Reference,
			"target":   map[string]any{"space": space, "workerName": worker, "bundleName": "main", "endpointName": worker, "originReservationId": reservationID},
			"bindings": bindings,
		}})}
}

// reservedAndPrepared reserves res-api for prod/api and prepares operation op-1 for it, whose one
// binding API_KEY holds the canary.
func (h *harness) reservedAndPrepared() prepared {
	h.t.Helper()
	require.Equal(h.t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	p := h.prepare("op-1", "token-prepare-00000001", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(h.t, http.StatusCreated, p.reply.status, "body: %s", p.reply.body)
	return p
}

// secretModule answers with the length and SHA-256 of its API_KEY binding: it shows that the
// worker received its secret without ever showing the value.
const secretModule = `export default {
  async fetch(request, env) {
    const value = env.API_KEY ?? "";
    const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(value));
    const hex = [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
    return new Response("len=" + value.length + " sha256=" + hex);
  },
};`

func secretWorkerBody(reference string) map[string]any {
	b := workerBody()
	b["modules"] = map[string]string{"index.js": secretModule}
	b["requiredSensitiveVars"] = []string{"API_KEY"}
	b["runtimeInputReference"] = reference
	return b
}

// secretShown is what secretModule answers for value.
func secretShown(value string) string {
	sum := sha256.Sum256([]byte(value))
	return fmt.Sprintf("len=%d sha256=%x", len(value), sum)
}

// delivered reports whether the runtime node holds a delivery for scriptName.
func (h *harness) delivered(scriptName string) bool {
	h.t.Helper()
	st, err := h.runtimeClient().GetScript(context.Background(), scriptName)
	require.NoError(h.t, err)
	return st.Present && st.Secrets.Delivered
}

func (h *harness) runtimeClient() *selfhost.Client {
	h.t.Helper()
	c, err := selfhost.New(h.runtime.Info.AdminURL, h.runtime.Info.TokenFile)
	require.NoError(h.t, err)
	return c
}

func (h *harness) preparationStatus(op string) string {
	return h.status("SELECT status FROM runtime_input_preparations WHERE operation_id = $1", op)
}

func TestRuntimeInputIsSealedDeliveredOnceAndSettled(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	p := h.prepare("op-1", "token-prepare-00000001", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, p.reply.status, "body: %s", p.reply.body)
	proj := p.reply.json(t)
	require.Equal(t, "prepared", proj["status"])
	require.Equal(t, []any{"API_KEY"}, proj["bindingNames"])
	require.Equal(t, p.reference, proj["runtimeInputReference"])
	require.Regexp(t, `^prep-[0-9a-f]{32}$`, proj["preparationId"])

	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	wj := w.json(t)
	require.Equal(t, true, wj["ready"])
	require.Equal(t, map[string]any{"reference": p.reference, "status": "settled"}, wj["runtimeInputs"])

	// Delivered to the runtime node, which runs the worker with it: the worker's answer through
	// the edge shows the value by length and digest only.
	require.True(t, h.delivered(wj["scriptName"].(string)))
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	status, body, _ := h.runtime.Get(t, e["hostname"].(string), "/")
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, secretShown(secretCanary), body)

	require.Equal(t, "settled", h.preparationStatus("op-1"))
	require.Equal(t, "t", h.status("SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations WHERE operation_id = 'op-1'")[:1])
	bound := h.getReservation(h.key, "res-api").json(t)
	require.Equal(t, "bound", bound["status"])
	require.Equal(t, wj["uid"], bound["boundWorker"].(map[string]any)["uid"])

	// A replay of the worker answers as before; nothing is delivered twice.
	again := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, w.body, again.body)
	require.Equal(t, "true", again.header.Get("Takoform-Replayed"))
}

func TestRuntimeInputRefusesAMismatchedReference(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	res := h.getReservation(h.key, "res-api").json(t)
	// A reference computed with another origin than the reservation's.
	id := runtimeinput.Derive("n", runtimeinput.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api",
		OriginReservationID: "res-api", CanonicalPublicOrigin: "https://evil.example.test"}, map[string]vocab.Secret{"API_KEY": vocab.NewSecret(secretCanary)})
	r := h.do(req{method: http.MethodPut, path: prepPath(h.org.ID, "op-1"), key: h.key, token: "token-prepare-00000001", body: map[string]any{
		"format": runtimeinput.PreparationFormat, "materialSetNonce": "n", "runtimeInputReference": id.Reference,
		"target":   map[string]any{"space": "prod", "workerName": "api", "bundleName": "main", "endpointName": "api", "originReservationId": "res-api"},
		"bindings": map[string]string{"API_KEY": secretCanary},
	}})
	p := r.problem(t, http.StatusUnprocessableEntity, "reference_mismatch")
	require.Contains(t, p["detail"], res["canonicalOrigin"])
	require.NotContains(t, string(r.body), secretCanary)
	require.Zero(t, h.countRows("runtime_input_preparations"))
}

func (h *harness) countRows(table string) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

func TestRuntimeInputPathOrganizationMustBeTheKeys(t *testing.T) {
	t.Parallel()
	h := setup(t)
	other, _ := h.newOrg("globex")
	h.do(req{method: http.MethodGet, path: prepPath(other.ID, "op-1"), key: h.key}).problem(t, http.StatusForbidden, "forbidden")
	h.do(req{method: http.MethodPut, path: prepPath(other.ID, "op-1"), key: h.key, token: "token-prepare-00000001", body: map[string]any{}}).
		problem(t, http.StatusForbidden, "forbidden")
	h.do(req{method: http.MethodDelete, path: prepPath(other.ID, "op-1"), key: h.key, token: "token-prepare-00000001"}).problem(t, http.StatusForbidden, "forbidden")
}

func TestRuntimeInputTargetMustBeTheReservationsWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	// The target names another worker than the reservation holds.
	p := h.prepare("op-1", "token-prepare-00000001", "res-api", "prod", "web", map[string]string{"API_KEY": secretCanary})
	p.reply.problem(t, http.StatusUnprocessableEntity, "target_mismatch")
	p = h.prepare("op-2", "token-prepare-00000002", "res-api", "staging", "api", map[string]string{"API_KEY": secretCanary})
	p.reply.problem(t, http.StatusUnprocessableEntity, "target_mismatch")

	// A worker may not consume a runtime input that targets another worker.
	ok := h.prepare("op-3", "token-prepare-00000003", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, ok.reply.status)
	h.putWorker("prod", "web", workerToken, secretWorkerBody(ok.reference)).problem(t, http.StatusUnprocessableEntity, "target_mismatch")
	require.Equal(t, "prepared", h.preparationStatus("op-3"))
}

func TestRuntimeInputExpiredPreparationCannotBeClaimed(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	h.exec("UPDATE runtime_input_preparations SET expires_at = now() - interval '1 second'")
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusConflict, "lease_unavailable")
	require.Equal(t, "expired", h.preparationStatus("op-1"))
	require.Equal(t, "t", h.status("SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations")[:1], "an expired row keeps only value-free identity")
}

func TestRuntimeInputSecondClaimIsRefused(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	// Another incarnation holds the claim.
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', worker_uid = gen_random_uuid(), worker_revision = 1,
		claimed_at = now(), claim_expires_at = now() + interval '15 minutes'`)
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusConflict, "lease_unavailable")
	require.Equal(t, "claimed", h.preparationStatus("op-1"))
	// And its claim fences the reservation's release.
	fence := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Contains(t, fence["unmetFences"], "lease_claimed")
}

func TestRuntimeInputCorruptCiphertextFailsClosedWithoutASecondClaim(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	h.exec(`UPDATE runtime_input_preparations SET ciphertext = set_byte(ciphertext, 0, get_byte(ciphertext, 0) # 1)`)

	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusConflict, "sealed_material_unreadable")
	require.Equal(t, "failed", h.preparationStatus("op-1"))
	// The retry is refused: a failed lease never issues a second claim.
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusConflict, "lease_unavailable")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status("SELECT script_name FROM workers LIMIT 1"))
	require.NoError(t, err)
	require.False(t, st.Secrets.Delivered, "nothing was delivered")
}

func TestRuntimeInputCiphertextSwappedBetweenRowsFails(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-web", tokenB, apiBody("prod", "web")).status)
	a := h.prepare("op-a", "token-prepare-0000000a", "res-api", "prod", "api", map[string]string{"API_KEY": "value-for-api"})
	b := h.prepare("op-b", "token-prepare-0000000b", "res-web", "prod", "web", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, a.reply.status)
	require.Equal(t, http.StatusCreated, b.reply.status)
	// Move web's sealed material onto api's row.
	h.exec(`UPDATE runtime_input_preparations a SET ciphertext = b.ciphertext, sealing_nonce = b.sealing_nonce, sealing_key_id = b.sealing_key_id
		FROM runtime_input_preparations b WHERE a.operation_id = 'op-a' AND b.operation_id = 'op-b'`)
	h.putWorker("prod", "api", workerToken, secretWorkerBody(a.reference)).problem(t, http.StatusConflict, "sealed_material_unreadable")
	require.Equal(t, "failed", h.preparationStatus("op-a"))
}

func TestRuntimeInputRotationOldKeyOpensRetiredKeyDoesNot(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-web", tokenB, apiBody("prod", "web")).status)
	a := h.prepare("op-a", "token-prepare-0000000a", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, a.reply.status)
	_, _, err := sealing.Rotate(context.Background(), h.db, h.kek)
	require.NoError(t, err)
	// Sealed under the previous key, still in the ring: it opens.
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(a.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	require.Equal(t, "settled", h.preparationStatus("op-a"))

	b := h.prepare("op-b", "token-prepare-0000000b", "res-web", "prod", "web", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, b.reply.status)
	for range sealing.MaxPreviousKeys + 1 {
		_, _, err := sealing.Rotate(context.Background(), h.db, h.kek)
		require.NoError(t, err)
	}
	p := h.putWorker("prod", "web", "token-worker-web-000001", secretWorkerBody(b.reference)).problem(t, http.StatusConflict, "sealed_material_unreadable")
	require.Contains(t, p["detail"], "retired key")
	require.Equal(t, "failed", h.preparationStatus("op-b"))
}

func TestRuntimeInputAbortRevokesAndWorkerDeletionWaitsForAClaim(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.reservedAndPrepared()
	got := h.get(prepPath(h.org.ID, "op-1")).json(t)
	require.Equal(t, "token-prepare-00000001", got["ownershipToken"])

	// The worker exists (without consuming); a claim on it is taken by a stopped request.
	h.mustWorker("prod", "api", workerToken)
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', worker_uid = (SELECT uid FROM workers), worker_revision = 1,
		claimed_at = now(), claim_expires_at = now() + interval '15 minutes'`)
	h.deleteWorker("prod", "api", workerToken).problem(t, http.StatusConflict, "lease_claimed")

	aborted := h.do(req{method: http.MethodDelete, path: prepPath(h.org.ID, "op-1"), key: h.key, token: "token-prepare-00000001"})
	require.Equal(t, http.StatusOK, aborted.status, "body: %s", aborted.body)
	require.Equal(t, "aborted", aborted.json(t)["status"])
	require.Equal(t, "t", h.status("SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations")[:1])
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status, "the claim is gone")
}

// crash is what a test hook panics with to stop one request in-process where a crashed Host would
// stop it: the operation is left running and no later step happens. The Host process itself goes
// on; the tests that kill a real `takoserver serve` process mid-dispatch are in
// server/cmd/takoserver (TestAHostKilledMidDispatchNeverDeliversTwice and the invariant test).
type crash struct{}

func TestRuntimeInputRequestStoppedBetweenDispatchAndDeliveryIsNeverRedispatched(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.hooks.AfterDispatchCommit = func() error { panic(crash{}) }
	})
	p := h.reservedAndPrepared()
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusInternalServerError, "internal")
	require.Equal(t, "dispatched", h.preparationStatus("op-1"))
	require.Equal(t, "t", h.status("SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations")[:1], "dispatch cleared the ciphertext")

	h.advance("2 minutes") // the stopped Host's lease runs out
	h.host.Sweep(context.Background())
	require.Equal(t, "failed", h.preparationStatus("op-1"), "nothing was delivered, so recovery fails it")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status("SELECT script_name FROM workers"))
	require.NoError(t, err)
	require.False(t, st.Secrets.Delivered, "recovery never dispatches again")
	require.Equal(t, "deleted", h.status("SELECT status FROM workers"), "the create that never committed never existed")
}

func TestRuntimeInputRequestStoppedAfterTheBackendAppliedSettlesByReadback(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.hooks.AfterDelivery = func() error { panic(crash{}) }
	})
	p := h.reservedAndPrepared()
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusInternalServerError, "internal")
	require.Equal(t, "dispatched", h.preparationStatus("op-1"))

	h.advance("2 minutes") // the stopped Host's lease runs out
	h.host.Sweep(context.Background())
	require.Equal(t, "settled", h.preparationStatus("op-1"), "the readback matches what was sealed")
}

// TestRuntimeInputTwoPoolsRacingTheDispatchCASOneWins: the dispatch compare-and-swap run on one
// claim from two connection pools at once, released together: exactly one wins, so exactly one
// could deliver. (Two real Host processes consuming one runtime input at once are in
// server/cmd/takoserver: TestTwoHostProcessesConsumingOneRuntimeInputDeliverItOnce.)
func TestRuntimeInputTwoPoolsRacingTheDispatchCASOneWins(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.hooks.AfterAcquire = func() { panic(crash{}) } // stop right after the claim
	})
	p := h.reservedAndPrepared()
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusInternalServerError, "internal")
	require.Equal(t, "claimed", h.preparationStatus("op-1"))
	var epoch int64
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT epoch FROM runtime_input_preparations").Scan(&epoch))

	start := make(chan struct{})
	won := make([]bool, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range 2 {
		pool, err := pgxpool.New(context.Background(), h.dbURL)
		require.NoError(t, err)
		defer pool.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := dbsqlc.New(pool).PreparationDispatch(context.Background(), dbsqlc.PreparationDispatchParams{OrganizationID: h.org.ID, OperationID: "op-1", Epoch: epoch})
			won[i], errs[i] = err == nil, err
			if errors.Is(err, pgx.ErrNoRows) {
				errs[i] = nil
			}
		}()
	}
	close(start)
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	require.ElementsMatch(t, []bool{true, false}, won, "exactly one dispatch")
	require.Equal(t, "dispatched", h.preparationStatus("op-1"))
}

// TestRuntimeInputCanaryAppearsNowhere: a runtime input whose value is a unique canary is applied
// and consumed; the canary appears in no HTTP response, no log line at debug level and nowhere in
// a pg_dump of the database: not raw, and not under nested base64 or hex.
func TestRuntimeInputCanaryAppearsNowhere(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	h.get(prepPath(h.org.ID, "op-1"))
	h.get("/v1/spaces/prod/workers/api")
	h.get("/v1/operations/" + w.header.Get("Takoform-Operation-Id"))
	// A refused preparation with the canary in its body, too.
	h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "web", map[string]string{"API_KEY": secretCanary})

	// The value really was delivered, so a search that finds nothing means something.
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	_, shown, _ := h.runtime.Get(t, e["hostname"].(string), "/")
	require.Equal(t, secretShown(secretCanary), shown)
	var files strings.Builder
	require.NoError(t, filepath.WalkDir(h.runtime.StateDir, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err // directories, and the sockets of running processes
		}
		raw, err := os.ReadFile(path)
		files.Write(raw)
		return err
	}))

	dump := h.pgDump()
	require.Contains(t, dump, "runtime_input_preparations", "the dump covers the table")

	forms := []string{
		secretCanary,
		base64.StdEncoding.EncodeToString([]byte(secretCanary)),
		base64.RawURLEncoding.EncodeToString([]byte(secretCanary)),
		hex.EncodeToString([]byte(secretCanary)),
		strings.ToUpper(hex.EncodeToString([]byte(secretCanary))),
		"9d31f7a0c2e4b",
	}
	for where, text := range map[string]string{"HTTP responses": h.responses.String(), "logs": h.logs.String(), "pg_dump": dump,
		"the runtime's logs": h.runtime.Logs.String(), "the runtime's files": files.String()} {
		require.NotEmpty(t, text)
		for _, f := range forms {
			require.False(t, strings.Contains(text, f), "%s contain the canary as %q", where, f)
		}
		chain, found := leakscan.FindString(text, secretCanary)
		require.False(t, found, "%s contain the canary encoded as %q", where, chain)
	}
}

func TestRuntimeInputClaimExpiresAfterItsWindow(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.reservedAndPrepared()
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', worker_uid = gen_random_uuid(), worker_revision = 1,
		claimed_at = now() - interval '16 minutes', claim_expires_at = now() - interval '1 minute'`)
	got := h.get(prepPath(h.org.ID, "op-1")).json(t)
	require.Equal(t, "expired", got["status"], "a read computes the expiry")
	require.Equal(t, "claimed", h.preparationStatus("op-1"), "and writes nothing")
	h.host.Sweep(context.Background())
	require.Equal(t, "expired", h.preparationStatus("op-1"))
	require.Equal(t, "t", h.status("SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations")[:1], "the janitor drops the sealed material")
	// An expired claim no longer fences the reservation.
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-api", tokenA).status)
}

// TestRuntimeInputClaimNeedsTheWorkerLiveAtTheClaimedRevision exercises the acquisition statement
// itself: the guard that keeps a claim and the worker's deletion apart lives in it.
func TestRuntimeInputClaimNeedsTheWorkerLiveAtTheClaimedRevision(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	w := h.mustWorker("prod", "api", workerToken)
	uid := uuid.MustParse(w["uid"].(string))
	h.exec(`UPDATE worker_endpoint_origin_reservations SET status = 'bound', bound_worker_uid = $1, bound_worker_revision = $2`, uid, int64(w["revision"].(float64)))

	script := w["scriptName"].(string)
	acquire := func(revision int64) bool {
		_, err := dbsqlc.New(h.db).PreparationAcquire(context.Background(), dbsqlc.PreparationAcquireParams{
			OrganizationID: h.org.ID, OperationID: "op-1", Epoch: 1, Reference: p.reference,
			Space: "prod", WorkerName: "api", WorkerUID: &uid, WorkerRevision: &revision, NativeName: &script,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return false
		}
		require.NoError(t, err)
		return true
	}
	revision := int64(w["revision"].(float64))
	require.False(t, acquire(revision-1), "a stale revision claims nothing")
	h.exec(`UPDATE workers SET status = 'deleting'`)
	require.False(t, acquire(revision), "a deleting worker is never claimed")
	h.exec(`UPDATE workers SET status = 'live'`)
	require.True(t, acquire(revision))
	require.Equal(t, "claimed", h.preparationStatus("op-1"))
}

// TestRuntimeInputBindingNamesMustEqualTheWorkersRequiredVars: "The binding names must equal the
// consuming worker's requiredSensitiveVars exactly (else 422 target_mismatch)".
func TestRuntimeInputBindingNamesMustEqualTheWorkersRequiredVars(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	p := h.prepare("op-1", "token-prepare-00000001", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary, "EXTRA": "x"})
	require.Equal(t, http.StatusCreated, p.reply.status)
	r := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusUnprocessableEntity, "target_mismatch")
	require.Contains(t, r["detail"], "requires exactly")
	require.Equal(t, "prepared", h.preparationStatus("op-1"), "nothing was claimed")
}

// TestRuntimeInputStatusByReferenceStaysWithinTheOrganization: GET
// /v1/worker-runtime-input-references/{reference} answers the preparation's status to its own
// organization and 404 to any other: a reference is not a bearer credential.
func TestRuntimeInputStatusByReferenceStaysWithinTheOrganization(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	got := h.get("/v1/worker-runtime-input-references/" + p.reference)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	require.Equal(t, "prepared", got.json(t)["status"])
	require.Nil(t, got.json(t)["boundWorker"])
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).json(t)
	settled := h.get("/v1/worker-runtime-input-references/" + p.reference).json(t)
	require.Equal(t, "settled", settled["status"])
	require.Equal(t, w["uid"], settled["boundWorker"].(map[string]any)["uid"])
	_, other := h.newOrg("globex")
	h.do(req{method: http.MethodGet, path: "/v1/worker-runtime-input-references/" + p.reference, key: other}).problem(t, http.StatusNotFound, "not_found")
}

// TestRuntimeInputDeleteAnswersInAnyState: "DELETE of a preparation in any state answers 200 and
// leaves a tombstone; a settled one's values stay with its worker on the backend".
func TestRuntimeInputDeleteAnswersInAnyState(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).json(t)
	deleted := h.do(req{method: http.MethodDelete, path: prepPath(h.org.ID, "op-1"), key: h.key, token: "token-prepare-00000001"})
	require.Equal(t, http.StatusOK, deleted.status, "body: %s", deleted.body)
	require.Equal(t, "settled", deleted.json(t)["status"], "a settled preparation stays settled")
	again := h.do(req{method: http.MethodDelete, path: prepPath(h.org.ID, "op-1"), key: h.key, token: "token-prepare-00000001"})
	require.Equal(t, deleted.body, again.body)
	require.Equal(t, "true", again.header.Get("Takoform-Replayed"))
	require.True(t, h.delivered(w["scriptName"].(string)), "the values stay with the worker")
	require.Equal(t, true, h.get("/v1/spaces/prod/workers/api").json(t)["ready"])
}

// TestRuntimeInputStuckAfterDispatchFailsSayingToBumpTheVersion: a lease left dispatched by a
// request stopped in-process after its dispatch, whose readback shows nothing, ends failed with a
// detail that says what to do.
func TestRuntimeInputStuckAfterDispatchFailsSayingToBumpTheVersion(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.hooks.AfterDispatchCommit = func() error { panic(crash{}) }
	})
	p := h.reservedAndPrepared()
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusInternalServerError, "internal")
	h.advance("2 minutes")
	h.host.Sweep(context.Background())
	got := h.get(prepPath(h.org.ID, "op-1")).json(t)
	require.Equal(t, "failed", got["status"])
	require.Contains(t, got["failure"], "bump bindings_wo_version")
}
