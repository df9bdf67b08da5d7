package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/server"
)

// quotaCatalog is the default catalog as a file, with the given top-level "quotas" and "rates"
// objects (either may be empty).
func quotaCatalog(quotas, rates string) func(*options) {
	return func(o *options) {
		extra := ""
		if quotas != "" {
			extra += `, "quotas": ` + quotas
		}
		if rates != "" {
			extra += `, "rates": ` + rates
		}
		o.catalogJSON = `{
  "installations": [{"name": "selfhost", "pack": "selfhost"}],
  "offerings": [
    {"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": ["*"]},
    {"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": ["*"]}
  ]` + extra + `}`
	}
}

// snapshot is everything a refused create could have changed: a digest of every row of every
// table (the ledger's refused operations aside: a refusal is recorded as one), the operations
// still running, and the scripts and routes the runtime node holds.
func (h *harness) snapshot() map[string]string {
	h.t.Helper()
	ctx := context.Background()
	rows, err := h.db.Query(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename`)
	require.NoError(h.t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(h.t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(h.t, rows.Err())
	require.Contains(h.t, tables, "organization_quotas")
	out := map[string]string{}
	for _, table := range tables {
		where := ""
		if table == "operations" {
			where = "WHERE t.status <> 'refused'"
		}
		var n int
		var digest string
		require.NoError(h.t, h.db.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(md5(string_agg(t::text, '|' ORDER BY t::text)), '') FROM %q t %s`, table, where)).Scan(&n, &digest))
		out[table] = fmt.Sprintf("%d rows %s", n, digest)
	}
	out["running operations"] = fmt.Sprint(h.count(`SELECT count(*) FROM operations WHERE status = 'running'`))
	st, err := h.runtimeClient().Status(ctx)
	require.NoError(h.t, err)
	var native []string
	for _, s := range st.Scripts {
		native = append(native, "script "+s.ScriptName)
	}
	for _, r := range st.Routes {
		native = append(native, "route "+r.Hostname)
	}
	slices.Sort(native)
	out["runtime node"] = strings.Join(native, ", ")
	return out
}

// quotaExceeded checks r is the refusal of a create past a ceiling, naming it, and that the
// refusal is final: no Retry-After, so that no client waits for it to clear.
func quotaExceeded(t *testing.T, r reply, resource quota.Resource, ceiling, used int) {
	t.Helper()
	p := r.problem(t, http.StatusTooManyRequests, "quota_exceeded")
	require.Equal(t, map[string]any{"resource": resource.Name(), "ceiling": float64(ceiling), "used": float64(used)}, p["quota"])
	require.Contains(t, p["detail"], fmt.Sprintf("ceiling is %d", ceiling))
	require.Empty(t, r.header.Get("Retry-After"), "a quota does not clear by waiting")
}

// refusedChangesNothing sends a create that a ceiling refuses and checks the database and the
// runtime node are exactly as before, and the refusal is in the ledger as refused.
func (h *harness) refusedChangesNothing(send func() reply, resource quota.Resource, ceiling, used int) {
	h.t.Helper()
	before := h.snapshot()
	refusedBefore := h.count(`SELECT count(*) FROM operations WHERE status = 'refused' AND code = 'quota_exceeded'`)
	quotaExceeded(h.t, send(), resource, ceiling, used)
	require.Equal(h.t, before, h.snapshot(), "a refused create changes nothing")
	require.Equal(h.t, refusedBefore+1, h.count(`SELECT count(*) FROM operations WHERE status = 'refused' AND code = 'quota_exceeded'`))
}

func TestQuotaWorkersCeilingRefusesTheCreateOverItAndADeleteFreesASlot(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog(`{"workers": 2}`, ""))
	h.mustWorker("prod", "one", "token-worker-one-000001")
	h.mustWorker("prod", "two", "token-worker-two-000001")

	h.refusedChangesNothing(func() reply { return h.putWorker("prod", "three", "token-worker-three-0001", workerBody()) }, quota.Workers, 2, 2)

	// Another organization has a ceiling of its own.
	_, otherKey := h.newOrg("globex")
	r := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/three", key: otherKey, token: "token-worker-three-0001", body: workerBody()})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)

	// A replay of a create and an update of a standing worker are not creates.
	replay := h.putWorker("prod", "one", "token-worker-one-000001", workerBody())
	require.Equal(t, http.StatusCreated, replay.status, "body: %s", replay.body)
	require.Equal(t, "true", replay.header.Get("Takoform-Replayed"))
	changed := workerBody()
	changed["compatibilityDate"] = "2025-02-02"
	require.Equal(t, http.StatusOK, h.putWorker("prod", "one", "token-worker-one-000001", changed).status)

	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "two", "token-worker-two-000001").status)
	r = h.putWorker("prod", "three", "token-worker-three-0001", workerBody())
	require.Equal(t, http.StatusCreated, r.status, "a delete frees a slot: %s", r.body)
}

func TestQuotaEndpointsCeilingRefusesTheCreateOverIt(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog(`{"endpoints": 1}`, ""))
	h.mustWorker("prod", "one", "token-worker-one-000001")
	h.mustWorker("prod", "two", "token-worker-two-000001")
	h.mustEndpoint("prod", "one", "token-endpoint-one-0001", map[string]any{"worker": "one"})

	// The Host would mint a reservation for it: the refusal leaves none.
	h.refusedChangesNothing(func() reply {
		return h.putEndpoint("prod", "two", "token-endpoint-two-0001", map[string]any{"worker": "two"})
	}, quota.Endpoints, 1, 1)

	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "one", "token-endpoint-one-0001").status)
	r := h.putEndpoint("prod", "two", "token-endpoint-two-0001", map[string]any{"worker": "two"})
	require.Equal(t, http.StatusCreated, r.status, "a delete frees a slot: %s", r.body)
}

func TestQuotaReservationsCeilingCountsHostMintedOnes(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog(`{"reservations": 1}`, ""))
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "a")).status)

	h.refusedChangesNothing(func() reply { return h.putReservation(h.key, "res-b", tokenB, apiBody("prod", "b")) }, quota.Reservations, 1, 1)
	// The refusal conforms to the API document.
	require.Equal(t, http.StatusTooManyRequests, newConformance(t).raw(t, http.MethodPut, h.url+resPath+"res-b", h.key,
		map[string]string{"Takoform-Ownership-Token": tokenB, "Content-Type": "application/json"}, `{"space":"prod","workerName":"b"}`))

	// A Host-minted reservation counts like a supplied one: the endpoint that would mint it is
	// refused, and neither its row nor the endpoint nor a route is left.
	h.mustWorker("prod", "api", workerToken)
	h.refusedChangesNothing(func() reply { return h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"}) }, quota.Reservations, 1, 1)

	// A replay of the reservation's create is never refused, even with the ceiling now below it.
	require.NoError(t, quota.Set(context.Background(), h.db, h.org.ID, quota.Reservations, ptr(0)))
	replay := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "a"))
	require.Equal(t, http.StatusCreated, replay.status, "body: %s", replay.body)
	require.Equal(t, "true", replay.header.Get("Takoform-Replayed"))
	quotaExceeded(t, h.putReservation(h.key, "res-b", tokenB, apiBody("prod", "b")), quota.Reservations, 0, 1)
	require.NoError(t, quota.Set(context.Background(), h.db, h.org.ID, quota.Reservations, nil))

	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-a", tokenA).status)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api"})
	require.Equal(t, true, e["hostMinted"], "a release frees the slot the mint takes")
	quotaExceeded(t, h.putReservation(h.key, "res-b", tokenB, apiBody("prod", "b")), quota.Reservations, 1, 1)
}

func TestQuotaPendingRuntimeInputsCeiling(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog(`{"runtimeInputs": 1}`, ""))
	p := h.reservedAndPrepared()

	h.refusedChangesNothing(func() reply {
		return h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": "another"}).reply
	}, quota.RuntimeInputs, 1, 1)

	// Delivered, the first is no longer pending.
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	require.Equal(t, "settled", h.preparationStatus("op-1"))
	r := h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": "another"}).reply
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	// Aborted, neither is.
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodDelete, path: prepPath(h.org.ID, "op-2"), key: h.key, token: "token-prepare-00000002"}).status)
	r = h.prepare("op-3", "token-prepare-00000003", "res-api", "prod", "api", map[string]string{"API_KEY": "third"}).reply
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
}

func ptr[T any](v T) *T { return &v }

// replica starts a second Host process's API over the harness's database: its own pool, its own
// server, the catalog opt builds, as a second replica behind a load balancer would be.
func (h *harness) replica(opt func(*options)) string {
	h.t.Helper()
	var o options
	opt(&o)
	cat := loadCatalog(h.t, o.catalogJSON, h.runtime.Info)
	db, err := pgxpool.New(context.Background(), h.dbURL)
	require.NoError(h.t, err)
	h.t.Cleanup(db.Close)
	srv := server.New(server.Config{KeyCacheTTL: -1, Host: host.New(host.Config{DB: db, Catalog: cat, SealingRing: h.ring,
		Logger: slog.New(slog.NewJSONHandler(&runtimetest.Buffer{}, nil))})})
	ts := httptest.NewServer(srv.Handler())
	h.t.Cleanup(ts.Close)
	return ts.URL
}

// tryAt is try against the API at base (another replica).
func (h *harness) tryAt(base string, r req) (reply, error) {
	other := *h
	other.url = base
	return other.try(r)
}

// TestQuotaHoldsUnderConcurrentCreatesOnTwoReplicas: creates that race at the ceiling, half of
// them through another Host replica on the same database, pass exactly up to the ceiling.
func TestQuotaHoldsUnderConcurrentCreatesOnTwoReplicas(t *testing.T) {
	t.Parallel()
	testQuotaRace(t, 4, 12)
}

// TestQuotaHoldsWhenCreatesRaceFromFarBelowTheCeiling: creates far below the ceiling take slots of
// their own and pass side by side; the race runs on into the ceiling, where the count becomes
// exact, and exactly the ceiling passes.
func TestQuotaHoldsWhenCreatesRaceFromFarBelowTheCeiling(t *testing.T) {
	t.Parallel()
	testQuotaRace(t, 40, 64)
}

func testQuotaRace(t *testing.T, ceiling, racers int) {
	cat := quotaCatalog(fmt.Sprintf(`{"reservations": %d, "workers": 1}`, ceiling), "")
	h := setup(t, cat)
	urls := []string{h.url, h.replica(cat)}

	race := func(n int, send func(i int, base string) (reply, error)) map[int]int {
		var wg sync.WaitGroup
		start := make(chan struct{})
		replies := make([]reply, n)
		errs := make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				replies[i], errs[i] = send(i, urls[i%2])
			}()
		}
		close(start)
		wg.Wait()
		statuses := map[int]int{}
		for i := range n {
			require.NoError(t, errs[i])
			statuses[replies[i].status]++
			if replies[i].status == http.StatusTooManyRequests {
				require.Contains(t, string(replies[i].body), `"quota_exceeded"`)
			}
		}
		return statuses
	}

	statuses := race(racers, func(i int, base string) (reply, error) {
		id := fmt.Sprintf("res-%02d", i)
		return h.tryAt(base, req{method: http.MethodPut, path: resPath + id, key: h.key, token: fmt.Sprintf("token-race-%010d", i), body: apiBody("prod", fmt.Sprintf("w%02d", i))})
	})
	require.Equal(t, map[int]int{http.StatusCreated: ceiling, http.StatusTooManyRequests: racers - ceiling}, statuses)
	require.Equal(t, ceiling, h.rowCount("status = 'prepared'"))

	// Two worker creates at ceiling-1 (here 0 of 1), one through each replica: one passes.
	statuses = race(2, func(i int, base string) (reply, error) {
		return h.tryAt(base, req{method: http.MethodPut, path: fmt.Sprintf("/v1/spaces/prod/workers/w%d", i), key: h.key,
			token: fmt.Sprintf("token-worker-%010d", i), body: workerBody()})
	})
	require.Equal(t, map[int]int{http.StatusCreated: 1, http.StatusTooManyRequests: 1}, statuses)
	require.Equal(t, 1, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`))
}
