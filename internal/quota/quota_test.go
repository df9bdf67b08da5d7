package quota_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// query returns the text of the named query in internal/store/queries/quotas.sql, its named
// parameters numbered as sqlc numbers them.
func query(t *testing.T, name string) string {
	t.Helper()
	raw, err := os.ReadFile("../store/queries/quotas.sql")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(raw), "-- name: "+name+" ")
	require.True(t, ok, "query %s", name)
	body, _, _ := strings.Cut(rest, "\n-- name: ")
	var lines []string
	for _, l := range strings.Split(body, "\n")[1:] {
		if !strings.HasPrefix(l, "--") {
			lines = append(lines, l)
		}
	}
	return regexp.MustCompile(`@organization_id`).ReplaceAllString(strings.Join(lines, "\n"), "$$1")
}

// scans lists the scan nodes of a JSON plan as "Node Type on relation using index".
func scans(plan any) []string {
	var out []string
	switch v := plan.(type) {
	case map[string]any:
		if rel, ok := v["Relation Name"].(string); ok {
			index, _ := v["Index Name"].(string)
			out = append(out, v["Node Type"].(string)+" on "+rel+" using "+index)
		}
		for _, child := range v {
			out = append(out, scans(child)...)
		}
	case []any:
		for _, child := range v {
			out = append(out, scans(child)...)
		}
	}
	return out
}

// TestQuotaUsageIsServedByIndexesBesideOtherTenantsRows (STYLE 14): the count every create runs
// reads only the organization's own live rows through an index, however many rows other
// organizations and its own history hold.
func TestQuotaUsageIsServedByIndexesBesideOtherTenantsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	small, err := auth.CreateOrganization(ctx, db, "small")
	require.NoError(t, err)
	big, err := auth.CreateOrganization(ctx, db, "big")
	require.NoError(t, err)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status, finished_at)
		VALUES ('00000000-0000-0000-0000-000000000001', $1, 'worker', 'x', 'PUT', 'committed', now())`, big.ID)
	// Other tenants' rows and the big one's deleted, released and expired history.
	exec(`INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT gen_random_uuid(), $1, 'prod', 'w' || i, '{}', 'index.js', '2025-01-01', 'w' || i, 'o', 'd', 'selfhost', 'selfhost',
		       (CASE WHEN i % 2 = 0 THEN 'live' ELSE 'deleted' END)::resource_status, '00000000-0000-0000-0000-000000000001'
		FROM generate_series(1, 20000) i`, big.ID)
	exec(`INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name, origin_reservation_id, host_minted,
		canonical_origin, hostname, offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT gen_random_uuid(), w.organization_id, w.space, w.name, w.uid, w.name, 'res-' || w.name, false,
		       'http://' || w.name || '.example', w.name || '.example', 'o', 'd', 'selfhost', 'selfhost', w.status, w.operation_id
		FROM workers w`)
	exec(`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		SELECT $1, 'res-' || i, gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w' || i, 'w' || i,
		       'http://w' || i || '.example', 86400, (CASE WHEN i % 10 = 0 THEN 'prepared' ELSE 'released' END)::reservation_status, now() + interval '1 day',
		       'o', 'd', 'selfhost', 'selfhost'
		FROM generate_series(1, 20000) i`, big.ID)
	exec(`INSERT INTO runtime_input_preparations (organization_id, operation_id, preparation_id, reference, material_set_nonce,
		material_set_id, space, worker_name, bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin, binding_names,
		material_digest, digest_key_id, status, expires_at)
		SELECT $1, 'op-' || i, 'prep-' || md5(i::text), 'rip1.prep-' || md5(i::text) || '.' || md5(i::text) || md5(i::text),
		       'n', gen_random_uuid(), 'prod', 'w' || i, 'main', 'w' || i, 'res-' || i, 'http://w' || i || '.example', '{}',
		       decode(md5(i::text) || md5(i::text), 'hex'), 'k', 'expired', now() + interval '1 hour'
		FROM generate_series(1, 20000) i`, big.ID)
	exec(`ANALYZE`)

	var raw []byte
	require.NoError(t, db.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+query(t, "QuotaUsage"), small.ID).Scan(&raw))
	var plan any
	require.NoError(t, json.Unmarshal(raw, &plan))
	found := scans(plan)
	require.Len(t, found, 4, "%v", found)
	for _, s := range found {
		require.NotContains(t, s, "Seq Scan", "every count reads an index: %v", found)
	}
	// The organization's released reservations and spent runtime inputs are not walked either.
	require.Contains(t, strings.Join(found, "\n"), "worker_endpoint_origin_reservations using worker_endpoint_origin_reservations_live_idx")
	require.Contains(t, strings.Join(found, "\n"), "runtime_input_preparations using runtime_input_preparations_pending_idx")

	// And it counts what it should: the big organization's live rows only.
	usage, err := quota.Report(ctx, db, quota.Defaults(), big.ID)
	require.NoError(t, err)
	require.Equal(t, []quota.Usage{
		{Resource: quota.Endpoints, Ceiling: 100, Used: 10000},
		{Resource: quota.Reservations, Ceiling: 200, Used: 2000},
		{Resource: quota.RuntimeInputs, Ceiling: 100, Used: 0},
		{Resource: quota.Workers, Ceiling: 100, Used: 10000},
		{Resource: quota.CustomDomains, Ceiling: 20, Used: 0},
	}, usage)
}

// TestAQuotaCheckWaitsWhenEverySlotIsTaken: with all 16 of an organization's slots held by creates
// in flight, the next check waits for one of them; it never passes holding no slot (which would
// let more creates be in flight than the fast path's margin counts).
func TestAQuotaCheckWaitsWhenEverySlotIsTaken(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testdb.URL(t)+"&pool_max_conns=30")
	require.NoError(t, err)
	t.Cleanup(db.Close)
	org, err := auth.CreateOrganization(ctx, db, "busy")
	require.NoError(t, err)
	check := func(tx pgx.Tx) error {
		return quota.Check(ctx, tx, quota.Ceilings{Reservations: 1000}, org.ID, quota.Reservations)
	}
	// The organization's first check makes its slots; they exist once it commits.
	first, err := db.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, check(first))
	require.NoError(t, first.Commit(ctx))
	var holders []pgx.Tx
	for range 16 {
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, check(tx))
		holders = append(holders, tx)
	}
	t.Cleanup(func() {
		for _, tx := range holders {
			_ = tx.Rollback(ctx)
		}
	})
	// Eight more checks: each must wait (one drawing a slot that matches nothing would not).
	const waiters = 8
	done := make(chan error, waiters)
	for range waiters {
		go func() {
			tx, err := db.Begin(ctx)
			if err != nil {
				done <- err
				return
			}
			defer tx.Rollback(ctx) //nolint:errcheck
			err = check(tx)
			done <- err
			if err == nil {
				<-time.After(100 * time.Millisecond) // keep the slot a moment, as a create does
			}
		}()
	}
	// Ten tries' worth of time: a check holding no slot returns at once.
	select {
	case err := <-done:
		t.Fatalf("a check passed while every slot was taken: %v", err)
	case <-time.After(2 * time.Second):
	}
	for _, tx := range holders {
		require.NoError(t, tx.Rollback(ctx))
	}
	for range waiters {
		select {
		case err := <-done:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatal("a waiting check never got a slot")
		}
	}
}

// TestTheScriptCountIsServedByAnIndexBesideOtherInstallationsRows (STYLE 14): the script-ceiling
// count of one Cloudflare installation reads its own standing workers through an index, however
// many rows the other installations and its deleted history hold; and it counts exactly those.
func TestTheScriptCountIsServedByAnIndexBesideOtherInstallationsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	org, err := auth.CreateOrganization(ctx, db, "tenant")
	require.NoError(t, err)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status, finished_at)
		VALUES ('00000000-0000-0000-0000-000000000001', $1, 'worker', 'x', 'PUT', 'committed', now())`, org.ID)
	exec(`INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT gen_random_uuid(), $1, 'prod', 'w' || i, '{}', 'index.js', '2025-01-01', 'w' || i, 'o', 'd',
		       CASE WHEN i % 100 = 0 THEN 'workers-dev' ELSE 'selfhost' END, CASE WHEN i % 100 = 0 THEN 'cf' ELSE 'local' END,
		       (CASE WHEN i % 200 = 0 THEN 'deleted' ELSE 'live' END)::resource_status, '00000000-0000-0000-0000-000000000001'
		FROM generate_series(1, 20000) i`, org.ID)
	exec(`ANALYZE`)

	raw := explainScriptCount(ctx, t, db, "cf")
	var plan any
	require.NoError(t, json.Unmarshal(raw, &plan))
	found := scans(plan)
	require.Len(t, found, 1, "%v", found)
	require.Contains(t, found[0], "using workers_installation_live_idx", "%v", found)

	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, quota.CheckScripts(ctx, tx, "cf", 101))
	err = quota.CheckScripts(ctx, tx, "cf", 100)
	require.Error(t, err, "100 standing scripts on cf (its deleted ones do not count) reach a ceiling of 100")
	require.Contains(t, err.Error(), "quota_exceeded")
}

// explainScriptCount answers the generic plan (the one a function's statement runs with for every
// installation) of the statement installation_script_check counts with: installation_script_count's
// own body as the database holds it, its parameter numbered, under the settings the function sets.
func explainScriptCount(ctx context.Context, t *testing.T, db *pgxpool.Pool, installation string) []byte {
	t.Helper()
	var body string
	var config []string
	require.NoError(t, db.QueryRow(ctx, `SELECT prosrc, coalesce(proconfig, '{}') FROM pg_proc WHERE proname = 'installation_script_count'`).Scan(&body, &config))
	statement := regexp.MustCompile(`\binst\b`).ReplaceAllString(strings.TrimRight(strings.TrimSpace(body), ";"), "$$1")
	require.Contains(t, statement, "$1", "the count reads its installation parameter: %s", body)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	for _, c := range config {
		name, value, ok := strings.Cut(c, "=")
		require.True(t, ok, c)
		_, err := tx.Exec(ctx, `SELECT set_config($1, $2, true)`, name, value)
		require.NoError(t, err)
	}
	_, err = tx.Exec(ctx, `SET LOCAL plan_cache_mode = force_generic_plan`)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `PREPARE script_count(text) AS `+statement)
	require.NoError(t, err)
	var raw []byte
	// EXPLAIN EXECUTE takes no bind parameters: the value goes in as a quoted literal.
	literal := "'" + strings.ReplaceAll(installation, "'", "''") + "'"
	require.NoError(t, tx.QueryRow(ctx, `EXPLAIN (FORMAT JSON) EXECUTE script_count(`+literal+`)`).Scan(&raw))
	_, err = tx.Exec(ctx, `DEALLOCATE script_count`) // a prepared statement outlives its transaction
	require.NoError(t, err)
	return raw
}

// TestAScriptCheckTakesOneAdvisorySlotAndWritesNothing: far from the ceiling a worker create's
// script check holds one advisory slot of its installation and writes no row (its transaction has
// no id yet), so creates of every organization sold the installation pass side by side; the
// installation's other slots stay free.
func TestAScriptCheckTakesOneAdvisorySlotAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testdb.URL(t))
	require.NoError(t, err)
	t.Cleanup(db.Close)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, quota.CheckScripts(ctx, tx, "cf", 100))

	var xid *int64
	require.NoError(t, tx.QueryRow(ctx, `SELECT txid_current_if_assigned()`).Scan(&xid))
	require.Nil(t, xid, "the check wrote nothing")
	var held int
	require.NoError(t, tx.QueryRow(ctx, `
		SELECT count(*) FROM pg_locks l, generate_series(0, 15) AS s
		WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.granted
		  AND ((l.classid::bigint << 32) | l.objid::bigint) = script_slot_key('cf', s)`).Scan(&held))
	require.Equal(t, 1, held, "one slot of the installation is held")
}
