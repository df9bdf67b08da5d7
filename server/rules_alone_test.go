package server_test

// Each rule here is the only thing standing between a request and a broken guarantee: every other
// fence or check is made clear first, so that the test fails when this one rule is removed (issue
// 15: a suite in which removing a fence changes nothing tests something else).

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// TestRuleEndpointPresentAloneFencesRelease: "Release requires ... 2. the retained endpoint
// resource absent." An endpoint stands on the reservation while every other fence is clear (not
// activated, no lease, no attestation, its route's deployment deleted): the release is refused
// naming exactly endpoint_present, and another organization's probe for the origin gets nothing.
func TestRuleEndpointPresentAloneFencesRelease(t *testing.T) {
	t.Parallel()
	h := setup(t)
	shop := map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}
	res := h.putReservation(h.key, "res-api", tokenA, shop).json(t)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	// Only the endpoint row stands: its route counts as gone. (Written in SQL: no request leaves a
	// present endpoint without its route, and this fence is tested alone.)
	h.exec(`UPDATE deployments SET status = 'deleted' WHERE resource_uid = $1`, e["uid"])
	require.Zero(t, h.count(`SELECT count(*) FROM deletion_attestations WHERE uid = $1`, e["uid"]))
	require.Zero(t, h.count(`SELECT count(*) FROM runtime_input_preparations`))
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"], "not activated")

	p := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Equal(t, []any{"endpoint_present"}, p["unmetFences"])
	require.Equal(t, "bound", h.getReservation(h.key, "res-api").json(t)["status"], "a refused release changes nothing")

	// Another organization probes for the origin: the derivation says it is taken and a
	// reservation of it is refused.
	_, otherKey := h.newOrg("globex")
	d := h.do(req{method: http.MethodPost, path: "/v1/worker-endpoint-origin-derivations", key: otherKey, body: shop})
	require.Equal(t, http.StatusOK, d.status, "body: %s", d.body)
	require.Equal(t, res["canonicalOrigin"], d.json(t)["canonicalOrigin"])
	require.Equal(t, false, d.json(t)["available"])
	h.putReservation(otherKey, "res-steal", tokenB, shop).problem(t, http.StatusConflict, "origin_taken")
	require.Equal(t, 1, h.rowCount("canonical_origin = $1", res["canonicalOrigin"]))
	h.custodyHolds()
}

// TestRuleNoTwoPresentEndpointsShareAnOriginEvenPastTheGate: "no two present endpoints ever share a
// canonical origin (a partial unique index on the endpoint rows)". The SQL gates of the endpoint
// create are bypassed with a direct INSERT: the index alone refuses it, across organizations, and
// lets a deleted row share the origin.
func TestRuleNoTwoPresentEndpointsShareAnOriginEvenPastTheGate(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	other, _ := h.newOrg("globex")
	copyAs := func(status string) error {
		_, err := h.db.Exec(context.Background(), `INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name,
			origin_reservation_id, host_minted, canonical_origin, hostname, offering_id, offering_digest, pack, installation, status, operation_id)
			SELECT $2, $3, space, 'copy', worker_uid, worker_name, 'res-copy', host_minted, canonical_origin, hostname,
			       offering_id, offering_digest, pack, installation, $4, operation_id
			FROM worker_endpoints WHERE uid = $1`, e["uid"], uuid.New(), other.ID, status)
		return err
	}
	for _, status := range []string{"creating", "live", "deleting"} {
		err := copyAs(status)
		var pg *pgconn.PgError
		require.True(t, errors.As(err, &pg), "a second %s endpoint on the origin must be refused, got %v", status, err)
		require.Equal(t, "23505", pg.Code)
		require.Equal(t, "worker_endpoints_origin_key", pg.ConstraintName)
	}
	require.NoError(t, copyAs("deleted"), "a deleted endpoint holds no origin")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM worker_endpoints WHERE status <> 'deleted'`))
}

// TestRuleAStaleIfMatchIsARevisionConflictAndChangesNothing: "An update carries If-Match: <revision>
// ... a stale one gets 409 revision_conflict" (SPEC 3.2), for a worker (whose update would change
// the running code) and a reservation, checked directly on the objects.
func TestRuleAStaleIfMatchIsARevisionConflictAndChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	path := "/v1/spaces/prod/workers/api"
	put := func(greeting string, ifMatch int) reply {
		b := workerBody()
		b["modules"] = map[string]string{"index.js": `export default { async fetch() { return new Response("` + greeting + `") } }`}
		return h.do(req{method: http.MethodPut, path: path, key: h.key, token: workerToken, body: b,
			headers: map[string]string{"If-Match": strconv.Itoa(ifMatch)}})
	}
	first := h.putWorker("prod", "api", workerToken, workerBody())
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	read := int(first.json(t)["revision"].(float64))
	second := put("second", read)
	require.Equal(t, http.StatusOK, second.status, "body: %s", second.body)
	now := int(second.json(t)["revision"].(float64))
	require.Greater(t, now, read)

	// A late copy of an update written against the revision read first.
	deployments := h.count(`SELECT count(*) FROM deployments`)
	p := put("stale", read).problem(t, http.StatusConflict, "revision_conflict")
	require.EqualValues(t, now, p["currentRevision"])
	got := h.get(path).json(t)
	require.EqualValues(t, now, got["revision"], "nothing changed")
	require.EqualValues(t, second.json(t)["generation"], got["generation"])
	require.Equal(t, deployments, h.count(`SELECT count(*) FROM deployments`), "no deployment was planned for it")

	// A reservation: the same body with a stale If-Match is another request, refused.
	res := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, res.status)
	rev := int(res.json(t)["revision"].(float64))
	stale := h.do(req{method: http.MethodPut, path: resPath + "res-api", key: h.key, token: tokenA, body: apiBody("prod", "api"),
		headers: map[string]string{"If-Match": strconv.Itoa(rev + 7)}})
	require.EqualValues(t, rev, stale.problem(t, http.StatusConflict, "revision_conflict")["currentRevision"])
	require.EqualValues(t, rev, h.getReservation(h.key, "res-api").json(t)["revision"])
	current := h.do(req{method: http.MethodPut, path: resPath + "res-api", key: h.key, token: tokenA, body: apiBody("prod", "api"),
		headers: map[string]string{"If-Match": strconv.Itoa(rev)}})
	require.Equal(t, http.StatusOK, current.status, "body: %s", current.body)
}

// lyingSink is a backend whose readback answers a digest other than the one of what it holds: the
// values reach the runtime, but the Host must not take the backend's word without the match.
type lyingSink struct {
	backend.Mutator
}

func (l *lyingSink) Unwrap() backend.Mutator { return l.Mutator }

func (l *lyingSink) sink() backend.SecretSink { s, _ := backend.SinkOf(l.Mutator); return s }

func (l *lyingSink) DeliverSecrets(ctx context.Context, d backend.Delivery, values map[string]vocab.Secret) error {
	return l.sink().DeliverSecrets(ctx, d, values)
}

func (l *lyingSink) ReadbackSecrets(ctx context.Context, d backend.Delivery, challenge []byte) ([]byte, bool, error) {
	digest, present, err := l.sink().ReadbackSecrets(ctx, d, challenge)
	if err != nil || !present {
		return digest, present, err
	}
	wrong := append([]byte(nil), digest...)
	wrong[0] ^= 0x01
	return wrong, true, nil
}

// TestRuleASettleIsRefusedWhenTheReadbackDigestDiffers: "Settle requires the keyed digest of the
// backend's authoritative readback to match." A backend that holds the values but answers a wrong
// digest: the consumption fails closed (lease_unavailable, the preparation failed, saying why) and
// the worker never reads Ready with it.
func TestRuleASettleIsRefusedWhenTheReadbackDigestDiffers(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { return &lyingSink{Mutator: m} }
	})
	p := h.reservedAndPrepared()
	r := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	prob := r.problem(t, http.StatusConflict, "lease_unavailable")
	require.Contains(t, prob["detail"], "readback does not match")
	require.Equal(t, "failed", h.preparationStatus("op-1"))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM runtime_input_preparations WHERE status = 'settled'`))
	require.Zero(t, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`), "the worker that would run with it never committed")
}

// TestRuleTheSettleStatementComparesTheReadbackDigest: the settle's own SQL refuses a digest other
// than the stored one, whatever the Go code before it decided (SPEC 3.5, invariants live in the
// database).
func TestRuleTheSettleStatementComparesTheReadbackDigest(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.hooks.AfterAcquire = func() { panic(crash{}) } // leave the lease claimed
	})
	p := h.reservedAndPrepared()
	h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference)).problem(t, http.StatusInternalServerError, "internal")
	var epoch int64
	var digest []byte
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT epoch, material_digest FROM runtime_input_preparations").Scan(&epoch, &digest))
	q := dbsqlc.New(h.db)
	_, err := q.PreparationDispatch(context.Background(), dbsqlc.PreparationDispatchParams{OrganizationID: h.org.ID, OperationID: "op-1", Epoch: epoch})
	require.NoError(t, err)
	require.Equal(t, "dispatched", h.preparationStatus("op-1"))
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT epoch FROM runtime_input_preparations").Scan(&epoch))

	wrong := append([]byte(nil), digest...)
	wrong[len(wrong)-1] ^= 0x80
	_, err = q.PreparationSettle(context.Background(), dbsqlc.PreparationSettleParams{OrganizationID: h.org.ID, OperationID: "op-1", Epoch: epoch, ReadbackDigest: wrong})
	require.ErrorIs(t, err, pgx.ErrNoRows, "a wrong digest settles nothing")
	require.Equal(t, "dispatched", h.preparationStatus("op-1"))
	_, err = q.PreparationSettle(context.Background(), dbsqlc.PreparationSettleParams{OrganizationID: h.org.ID, OperationID: "op-1", Epoch: epoch, ReadbackDigest: digest})
	require.NoError(t, err, "the stored digest settles")
	require.Equal(t, "settled", h.preparationStatus("op-1"))
}

// TestRuleAnOldWorkersLiveDeploymentOrClaimedLeaseAnswersWitnessOpen: "While the old row is absent
// but a fence is still open (attestation, deployment, lease), both answer 409 code witness_open
// with unmetFences, retryable" — here the deployment, then the lease, each alone.
func TestRuleAnOldWorkersLiveDeploymentOrClaimedLeaseAnswersWitnessOpen(t *testing.T) {
	t.Parallel()
	h := setup(t)
	p := h.reservedAndPrepared()
	old := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, old.status, "body: %s", old.body)
	oldUID := old.json(t)["uid"]
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	require.Equal(t, "closed", h.status(`SELECT status FROM deletion_attestations WHERE uid = $1`, oldUID))
	h.mustWorker("prod", "api", "token-worker-0000000002")
	endpoint := map[string]any{"worker": "api", "originReservationId": "res-api"}

	// The old worker's deployment reads live again: its code may still run. (Written in SQL, as
	// the claim below: a real unconfirmed delete keeps the attestation open too, and each fence
	// here is tested alone.)
	h.exec(`UPDATE deployments SET status = 'active' WHERE resource_uid = $1`, oldUID)
	r := h.putEndpoint("prod", "api", endpointToken, endpoint)
	require.Equal(t, []any{"deployment_live"}, r.problem(t, http.StatusConflict, "witness_open")["unmetFences"])
	require.Equal(t, oldUID, h.getReservation(h.key, "res-api").json(t)["boundWorker"].(map[string]any)["uid"], "nothing moved")
	h.exec(`UPDATE deployments SET status = 'deleted' WHERE resource_uid = $1`, oldUID)

	// An unexpired claim on the reservation: a delivery may be under way.
	p2 := h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": secretCanary})
	require.Equal(t, http.StatusCreated, p2.reply.status, "body: %s", p2.reply.body)
	h.exec(`UPDATE runtime_input_preparations SET status = 'claimed', worker_uid = $1, claim_expires_at = now() + interval '1 hour'
		WHERE operation_id = 'op-2'`, oldUID)
	r = h.putEndpoint("prod", "api", endpointToken, endpoint)
	require.Equal(t, []any{"lease_claimed"}, r.problem(t, http.StatusConflict, "witness_open")["unmetFences"])
	require.Equal(t, oldUID, h.getReservation(h.key, "res-api").json(t)["boundWorker"].(map[string]any)["uid"], "nothing moved")

	// Once the claim expires, the same request succeeds.
	h.advance("2 hours")
	require.Equal(t, http.StatusCreated, h.putEndpoint("prod", "api", endpointToken, endpoint).status)
}

// TestRuleReservationReplayNeedsTheExactTTLAndPlacement: "PUT replay succeeds only when subdomain,
// TTL, placement, offering digest and derived origin are exact; else 409 reservation_mismatch."
func TestRuleReservationReplayNeedsTheExactTTLAndPlacement(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.catalogJSON = twoWorkerOfferings })
	body := func(ttl int, offering string) map[string]any {
		return map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": ttl, "offeringId": offering}
	}
	first := h.putReservation(h.key, "res-api", tokenA, body(3600, "worker-a"))
	require.Equal(t, http.StatusCreated, first.status, "body: %s", first.body)
	h.putReservation(h.key, "res-api", tokenA, body(7200, "worker-a")).problem(t, http.StatusConflict, "reservation_mismatch")
	h.putReservation(h.key, "res-api", tokenA, body(3600, "worker-b")).problem(t, http.StatusConflict, "reservation_mismatch")
	// The operator moved the offerings to another installation at the same suffix and public
	// address (the offering's digest moves; the derived origin does not): the same intent, sent
	// again as a new request to a Host with that catalog, is refused too. (Moving the pool's
	// first node, runtimeUrl, is no longer placement: SPEC 6.2.)
	moved := strings.ReplaceAll(twoWorkerOfferings, `"local"`, `"elsewhere"`)
	rev := strconv.Itoa(int(first.json(t)["revision"].(float64)))
	r, err := h.tryAt(h.replica(func(o *options) { o.catalogJSON = moved }), req{method: http.MethodPut, path: resPath + "res-api", key: h.key,
		token: tokenA, body: body(3600, "worker-a"), headers: map[string]string{"If-Match": rev}})
	require.NoError(t, err)
	p := r.problem(t, http.StatusConflict, "reservation_mismatch")
	require.Equal(t, []any{"placement"}, p["mismatch"], "refused for the placement (its digest), not for the origin")
	require.Equal(t, first.json(t)["revision"], h.getReservation(h.key, "res-api").json(t)["revision"], "nothing changed")
}
