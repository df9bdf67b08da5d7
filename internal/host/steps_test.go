package host_test

import (
	"context"
	"net/http/httptest"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/server"
)

// One test per janitor step: each leaves the rows a step settles (through the API where it can,
// by SQL where only a crash or a backend without fences leaves them), runs one Sweep of the Host,
// and reads what the step did and what it logged. The late-write re-check needs a backend without
// fences (Cloudflare): server/late_writes_test.go runs it against the Cloudflare stand-in.

// fixture is a Host on a fresh database, with a runtime node that runs no code and the API in
// front of it, for one organization.
type fixture struct {
	t    *testing.T
	db   *pgxpool.Pool
	host *host.Host
	logs *runtimetest.Buffer
	api  *client.Client
	org  auth.Organization
	node *runtimetest.Harness
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	db := testdb.Pool(t)
	node, _ := runtimetest.StartWithoutWorkerd(t)
	cat := catalog.DefaultWithEdge(node.Info.AdminURL, node.Info.TokenFile, node.Info.EdgeAddr, node.Info.EdgeScheme)
	cat.Rates = catalog.Rates{}
	kekFile := t.TempDir() + "/sealing-key"
	_, err := sealing.WriteKEKFile(kekFile)
	require.NoError(t, err)
	kek, err := sealing.LoadKEK(kekFile)
	require.NoError(t, err)
	ring, err := sealing.OpenRing(context.Background(), db, kek)
	require.NoError(t, err)
	logs := &runtimetest.Buffer{}
	h := host.New(host.Config{DB: db, Catalog: cat, SealingRing: ring, Logger: slogTo(logs)})
	ts := httptest.NewServer(server.New(server.Config{Host: h, KeyCacheTTL: -1}).Handler())
	t.Cleanup(ts.Close)
	org, err := auth.CreateOrganization(context.Background(), db, "acme")
	require.NoError(t, err)
	key, err := auth.CreateKey(context.Background(), db, "acme", nil)
	require.NoError(t, err)
	api, err := client.New(client.Config{Endpoint: ts.URL, APIKey: key.Key, OrganizationID: org.ID})
	require.NoError(t, err)
	return &fixture{t: t, db: db, host: h, logs: logs, api: api, org: org, node: node}
}

func (f *fixture) exec(sql string, args ...any) {
	f.t.Helper()
	_, err := f.db.Exec(context.Background(), sql, args...)
	require.NoError(f.t, err)
}

func (f *fixture) text(sql string, args ...any) string {
	f.t.Helper()
	var s string
	require.NoError(f.t, f.db.QueryRow(context.Background(), sql, args...).Scan(&s))
	return s
}

// advance moves the database's clock forward by interval.
func (f *fixture) advance(interval string) {
	f.exec(`INSERT INTO clock_skew (skew) VALUES ($1::interval) ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`, interval)
}

// sweep runs the janitor once and answers the count its step logged under done, or the lines
// it logged under done when they carry no count (0 when it logged nothing); no step may have
// failed.
func (f *fixture) sweep(done string) int {
	f.t.Helper()
	before := len(logged(f.t, f.logs, "INFO"))
	f.host.Sweep(context.Background())
	require.Empty(f.t, logged(f.t, f.logs, "WARN"), "no step failed")
	n := 0
	for _, l := range logged(f.t, f.logs, "INFO")[before:] {
		if l["msg"] == done {
			if c, ok := l["count"].(float64); ok {
				n += int(c)
			} else {
				n++ // a step that logs each row it settled
			}
		}
	}
	return n
}

// worker creates prod/<name> serving a trivial module.
func (f *fixture) worker(name string) client.Worker {
	f.t.Helper()
	w, _, err := f.api.PutWorker(context.Background(), "prod", name, "token-worker-"+name+"-0000000001", 0, client.WorkerSpec{
		Modules: map[string]string{"index.js": "export default { fetch() { return new Response('ok') } }"}, MainModule: "index.js",
		CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}})
	require.NoError(f.t, err)
	return w
}

// The recovery step finishes the request of a Host that stopped mid-apply once its lease has run
// out, and leaves one whose lease is live.
func TestTheRecoveryStepFinishesAStoppedHostsRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.worker("api")
	op, deployment := uuid.New(), uuid.New()
	f.exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status) VALUES ($1, $2, 'worker', 'prod/api', 'PUT', 'running')`, op, f.org.ID)
	f.exec(`INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at) VALUES ($1, 'worker', 'prod/api', $2, 'a stopped Host', db_now() + interval '1 minute')`, f.org.ID, op)
	f.exec(`UPDATE workers SET generation = 2 WHERE uid = $1`, w.UID)
	f.exec(`INSERT INTO deployments (id, organization_id, resource_kind, resource_uid, generation, native_name, offering_id, offering_digest, pack, installation, status)
		SELECT $1, organization_id, 'worker', uid, 2, script_name, offering_id, offering_digest, pack, installation, 'pending' FROM workers WHERE uid = $2`, deployment, w.UID)
	f.exec(`INSERT INTO backend_effects (id, operation_id, deployment_id, action, status) VALUES ($1, $2, $3, 'apply', 'dispatched')`, uuid.New(), op, deployment)

	require.Zero(t, f.sweep("recovered operations left by a stopped Host"), "a live lease is left alone")
	require.Equal(t, "running", f.text(`SELECT status::text FROM operations WHERE id = $1`, op))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_ownership_leases", map[string]string{"state": "live"}))
	f.advance("2 minutes")
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_ownership_leases", map[string]string{"state": "expired"}), "the stopped Host's lease, as a metric")
	require.Equal(t, 1, f.sweep("recovered operations left by a stopped Host"))
	require.Equal(t, 0.0, metric(t, f.host, "takoserver_ownership_leases", map[string]string{"state": "expired"}))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_janitor_settled_total", map[string]string{"step": "recover"}))
	require.NotEqual(t, "running", f.text(`SELECT status::text FROM operations WHERE id = $1`, op))
	require.NotEqual(t, "pending", f.text(`SELECT status::text FROM deployments WHERE id = $1`, deployment), "its effect is decided")
}

// The orphan step takes down what a create that never committed left serving on the node.
func TestTheOrphanStepTakesDownWhatANeverCommittedCreateLeft(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.worker("api")
	// What a create that was undone leaves when its compensation could not be confirmed: the
	// worker gone, its deployment still open on the node.
	f.exec(`UPDATE workers SET status = 'deleted', deleted_at = now() WHERE uid = $1`, w.UID)
	require.Equal(t, "active", f.text(`SELECT status::text FROM deployments WHERE resource_uid = $1`, w.UID))
	require.Equal(t, 1, f.sweep("took down deployments of creates that never committed"))
	require.Equal(t, "deleted", f.text(`SELECT status::text FROM deployments WHERE resource_uid = $1`, w.UID))
	require.Zero(t, f.sweep("took down deployments of creates that never committed"), "once")
}

// The minted-release step releases the Host-minted reservation of a deleted worker once its old
// endpoint's deletion is confirmed, and not before.
func TestTheMintedReleaseStepWaitsForTheConfirmedDeletion(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	f.worker("api")
	e, _, err := f.api.PutEndpoint(ctx, "prod", "api", "token-endpoint-00000001", 0, client.EndpointSpec{Worker: "api"})
	require.NoError(t, err)
	require.True(t, e.HostMinted)
	_, err = f.api.DeleteEndpoint(ctx, "prod", "api", "token-endpoint-00000001")
	require.NoError(t, err)
	// The old endpoint's deletion is not confirmed yet: the worker delete's tail leaves the row.
	f.exec(`UPDATE deletion_attestations SET status = 'open', closed_at = NULL WHERE uid = $1`, e.UID)
	_, err = f.api.DeleteWorker(ctx, "prod", "api", "token-worker-api-0000000001")
	require.NoError(t, err)
	row := `SELECT status::text FROM worker_endpoint_origin_reservations WHERE id = $1`
	require.Equal(t, "bound", f.text(row, e.OriginReservationID))
	require.Zero(t, f.sweep("released Host-minted reservations of deleted workers"))
	require.Equal(t, "bound", f.text(row, e.OriginReservationID), "its fence is open")

	f.exec(`UPDATE deletion_attestations SET status = 'closed', closed_at = now() WHERE uid = $1`, e.UID)
	require.Equal(t, 1, f.sweep("released Host-minted reservations of deleted workers"))
	require.Equal(t, "released", f.text(row, e.OriginReservationID))
}

// The reservation step stores a reservation whose TTL passed as expired.
func TestTheReservationStepStoresALapsedReservationExpired(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ttl := int64(60)
	_, _, err := f.api.PutReservation(context.Background(), "res-api", "token-reservation-0001", client.ReservationRequest{Space: "prod", WorkerName: "api", TTLSeconds: &ttl})
	require.NoError(t, err)
	require.Zero(t, f.sweep("expired reservations whose TTL passed"))
	f.advance("2 minutes")
	require.Equal(t, 1, f.sweep("expired reservations whose TTL passed"))
	require.Equal(t, "expired", f.text(`SELECT status::text FROM worker_endpoint_origin_reservations WHERE id = 'res-api'`))
}

// The attestation step writes down the close of an attestation whose propagation window passed.
func TestTheAttestationStepClosesAnAttestationPastItsWindow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	w := f.worker("api")
	_, err := f.api.DeleteWorker(ctx, "prod", "api", "token-worker-api-0000000001")
	require.NoError(t, err)
	// As a Cloudflare delete leaves it: open until its route propagation window has passed.
	f.exec(`UPDATE deletion_attestations SET status = 'open', closed_at = NULL, closes_at = db_now() + interval '1 minute' WHERE uid = $1`, w.UID)
	f.host.Sweep(ctx)
	require.Equal(t, "open", f.text(`SELECT status FROM deletion_attestations WHERE uid = $1`, w.UID))
	f.advance("2 minutes")
	f.host.Sweep(ctx)
	require.Equal(t, "closed", f.text(`SELECT status FROM deletion_attestations WHERE uid = $1`, w.UID))
	require.Empty(t, logged(t, f.logs, "WARN"))
}

// The runtime-input step expires a preparation nobody consumed within its hour and drops its
// sealed material.
func TestTheRuntimeInputStepExpiresAnUnconsumedInputAndDropsItsSeal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	res, _, err := f.api.PutReservation(ctx, "res-api", "token-reservation-0001", client.ReservationRequest{Space: "prod", WorkerName: "api"})
	require.NoError(t, err)
	target := runtimeinput.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api",
		OriginReservationID: "res-api", CanonicalPublicOrigin: res.CanonicalOrigin}
	id := runtimeinput.Derive("nonce-1", target, map[string]vocab.Secret{"API_KEY": vocab.NewSecret("s3cret")}) // rip1, still taken
	_, _, err = f.api.PutPreparation(ctx, "op-1", "token-prepare-00000001", client.PreparationRequest{Format: client.PreparationFormat,
		MaterialSetNonce: "nonce-1", RuntimeInputReference: id.Reference, Bindings: map[string]string{"API_KEY": "s3cret"},
		Target: client.PreparationTarget{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api", OriginReservationID: "res-api"}})
	require.NoError(t, err)
	require.Zero(t, f.sweep("expired runtime inputs and dropped their sealed material"))
	f.advance("61 minutes")
	require.Equal(t, 1, f.sweep("expired runtime inputs and dropped their sealed material"))
	require.Equal(t, "expired", f.text(`SELECT status::text FROM runtime_input_preparations WHERE operation_id = 'op-1'`))
	require.Equal(t, "true", f.text(`SELECT (ciphertext IS NULL)::text FROM runtime_input_preparations WHERE operation_id = 'op-1'`))
}

// metric is the value of the sample of name with labels in a Host's registry; the test fails when
// there is none.
func metric(t *testing.T, h *host.Host, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := h.Registry.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; ok && v != l.GetValue() {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no sample %s%v", name, labels)
	return 0
}

// The reach step says, per installation, whether its runtime node answers the Host: 1 for a node
// that answers, 0 and a warning naming the installation for one that cannot be asked. Every call
// to a backend is counted by outcome, and the janitor's settled rows by step.
func TestTheReachStepAndTheBackendMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.worker("api")
	require.Zero(t, f.sweep(""))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_backend_reachable", map[string]string{"installation": "selfhost"}))
	require.GreaterOrEqual(t, metric(t, f.host, "takoserver_backend_calls_total", map[string]string{"installation": "selfhost", "call": "apply", "outcome": "ok"}), 1.0)

	logs := &runtimetest.Buffer{}
	gone := host.New(host.Config{DB: f.db, Logger: slogTo(logs),
		Catalog: catalog.DefaultWithEdge("http://127.0.0.1:1", "/nonexistent/admin-token", "127.0.0.1:1", "http")})
	gone.Sweep(context.Background())
	require.Equal(t, 0.0, metric(t, gone, "takoserver_backend_reachable", map[string]string{"installation": "selfhost"}))
	warned := false
	for _, l := range logged(t, logs, "WARN") {
		if l["step"] == "reach" {
			warned = true
			require.Contains(t, l["error"], "installation selfhost")
		}
	}
	require.True(t, warned, "the unreachable node is named")
	require.Equal(t, 1.0, metric(t, gone, "takoserver_janitor_failures_total", map[string]string{"step": "reach"}))
}

// The abandoned-ticks step fails a tick whose replica stopped between its claim and its outcome,
// once the tick is five minutes old, and leaves a tick still within that time and one recorded.
func TestTheAbandonedTicksStepFailsATickItsHostNeverRecorded(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.worker("api")
	f.exec(`INSERT INTO cron_ticks (id, worker_uid, cron, scheduled_for, outcome) VALUES
		(gen_random_uuid(), $1, '* * * * *', db_now() - interval '1 minute', 'claimed'),
		(gen_random_uuid(), $1, '*/5 * * * *', db_now() - interval '1 minute', 'ok')`, w.UID)
	require.Zero(t, f.sweep("failed cron ticks whose Host stopped before it recorded them"))
	f.advance("5 minutes")
	require.Equal(t, 1, f.sweep("failed cron ticks whose Host stopped before it recorded them"))
	require.Equal(t, "failed", f.text(`SELECT outcome::text FROM cron_ticks WHERE cron = '* * * * *'`))
	require.Equal(t, "ok", f.text(`SELECT outcome::text FROM cron_ticks WHERE cron = '*/5 * * * *'`))
}
