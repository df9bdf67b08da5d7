package dbsqlc

// The plans of the request path (STYLE 14, issue 15): every query a request runs is served by an
// index, however many rows other organizations hold and whatever the planner's statistics say,
// and reads the clock once per statement, never once per row. The test EXPLAINs the very text sqlc
// generated (the unexported constants of this package), as custom and as generic plans.

import (
	"context"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// offPath are the queries no request runs: the janitor's periodic sweeps, operators' commands and
// start-up. They may read a whole table; nothing else may.
var offPath = []string{
	"APIKeyCreate", "APIKeyRevoke", "APIKeyList", "OrganizationCreate", "OrganizationGetByName",
	"SealingKeysOpenable", "SealingKeyCurrentID", "SealingKeyInit", "SealingKeyRotate",
	"BrakeEngage", "BrakeRelease", "QuotaOverrides", "QuotaSet", "OwnershipLeaseCounts",
	"DeploymentsOrphaned", "OwnershipIntentsExpired", "OwnershipTombstonePurge", "PreparationSweepAll",
	"ReservationsOfGoneWorkers", "QuotaUsage", "QuotaUsageDrift", "LateWriteRechecksClaim", "LateWriteRecheckSettle",
	"ReconcileKnown", "ReconcileCurrent", "ReconcileDeliveries", "PoolBlobsSweep", "PoolBlobsOfInstallation", "PoolBlobReplace",
	// The cron loop's, beside the janitor's: every replica's pass reads the due rows by index.
	"CronsUnscheduled", "CronSchedule", "CronsDue", "CronClaim", "CronTickInsert", "CronTickFinish", "CronTicksTrim", "CronTicksAbandoned",
	// A pool's membership changes: `takoserver nodes` and the reconciler's.
	"RuntimeNodesLock", "RuntimeNodeInsert", "RuntimeNodeServe", "RuntimeNodeRetire", "RuntimeNodeDrain", "RuntimeNodeRemove", "RuntimeNodeEffectsInFlight", "RuntimePoolFenceRecord", "RuntimePoolFence", "RuntimePoolFenceSet", "RuntimeNodesBumpEpoch", "RuntimeNodeEvent", "RuntimeNodeEvents", "DBNow",
	// Start-up: the one-time rewrite of digests from before pools.
	"OfferingDigestMove", "WorkersWithoutPoolBlob",
	// The custom-domain checker's claim of the due rows (every replica's pass, by index).
	"CustomDomainsDue",
	// The janitor's pass over revoked custom domains.
	"CustomDomainRevokedHolds",
}

// small tables: a seq scan of them is cheaper than any index and never grows with tenants.
var small = []string{"clock_skew", "deployment_brakes", "sealing_keys", "runtime_input_commitment_secrets", "schema_migrations", "runtime_nodes", "runtime_pools", "host_secrets"}

// extra are statements that run inside the plpgsql functions of the request path (a plan of a
// function call does not show them), written as the functions run them.
var extra = map[string]string{
	"ownership_lock binding": `SELECT b.token FROM ownership_bindings b
		WHERE b.organization_id = $1 AND b.kind = $2 AND b.external_key = $3`,
	"ownership_lock tombstone": `SELECT t.token FROM ownership_tombstones t
		WHERE t.organization_id = $1 AND t.kind = $2 AND t.external_key = $3 AND t.token = $4 AND t.expires_at > $5::timestamptz`,
	"ownership_lock intent": `SELECT i.holder, i.lease_expires_at <= $4::timestamptz FROM ownership_intents i
		WHERE i.organization_id = $1 AND i.kind = $2 AND i.external_key = $3`,
	"quota_lock insert": `INSERT INTO organization_quotas (organization_id, resource)
		SELECT $1::text, w FROM unnest($2::text[]) AS w ORDER BY w ON CONFLICT DO NOTHING`,
	"quota_check override": `SELECT q.ceiling FROM organization_quotas q WHERE q.organization_id = $1::text AND q.resource = $2::text`,
	// quota_count runs its counts with sequential scans off (migrations 7 and 9): what this checks
	// is that each count has an index to run on.
	"quota_check workers":   `/*seqscan off*/ SELECT count(*) FROM workers w WHERE w.organization_id = $1::text AND w.status <> 'deleted'`,
	"quota_check endpoints": `/*seqscan off*/ SELECT count(*) FROM worker_endpoints e WHERE e.organization_id = $1::text AND e.status <> 'deleted'`,
	"quota_check reservations": `/*seqscan off*/ SELECT count(*) FROM worker_endpoint_origin_reservations r
		WHERE r.organization_id = $1::text AND r.status IN ('prepared', 'bound', 'activated')
		  AND (r.status = 'activated' OR r.expires_at > $2::timestamptz OR reservation_published(r.status, r.endpoint_uid))`,
	"quota_check runtime_inputs": `/*seqscan off*/ SELECT count(*) FROM runtime_input_preparations p
		WHERE p.organization_id = $1::text AND p.status IN ('prepared', 'claimed')
		  AND ((p.status = 'prepared' AND p.expires_at > $2::timestamptz) OR (p.status = 'claimed' AND p.claim_expires_at > $2::timestamptz))`,
	"quota_lock select": `SELECT q.resource, q.ceiling FROM organization_quotas q
		WHERE q.organization_id = $1::text AND q.resource = ANY ($2::text[]) ORDER BY q.resource FOR UPDATE`,
}

// generatedQueries returns the text of every query sqlc generated, by its name.
func generatedQueries(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.sql.go")
	require.NoError(t, err)
	out := map[string]string{}
	fset := token.NewFileSet()
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, 0)
		require.NoError(t, err)
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING || !strings.HasPrefix(lit.Value, "`-- name: ") {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			name := strings.Fields(strings.TrimPrefix(text, "-- name: "))[0]
			out[name] = text
			return true
		})
	}
	require.Greater(t, len(out), 50)
	return out
}

// fill gives the database what a Host with many tenants holds: organizations with keys and
// quotas, and in the big one's name every kind of row in every status, n of each.
func fill(t *testing.T, ctx context.Context, db *pgxpool.Pool, n int) {
	t.Helper()
	exec := func(sql string) {
		t.Helper()
		_, err := db.Exec(ctx, sql, n)
		require.NoError(t, err, sql)
	}
	exec(`INSERT INTO organizations (id, name) SELECT 'org_t' || lpad(i::text, 8, '0'), 'tenant' || i FROM generate_series(1, $1 / 10) i`)
	exec(`INSERT INTO api_keys (id, organization_id, secret_hash, scopes)
		SELECT 'key_k' || lpad(i::text, 8, '0'), 'org_t' || lpad((1 + i % ($1 / 10))::text, 8, '0'), sha256(i::text::bytea), '{resources:read,resources:write}'
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO organization_quotas (organization_id, resource)
		SELECT 'org_t' || lpad(i::text, 8, '0'), r FROM generate_series(1, $1 / 10) i, unnest('{endpoints,reservations,runtime_inputs,workers}'::text[]) r`)
	exec(`INSERT INTO operations (id, organization_id, kind, external_key, method, status, started_at, finished_at)
		SELECT md5('op' || i)::uuid, 'org_t00000001', 'worker', 'prod/w' || i, 'PUT',
		       (CASE WHEN i % 100 = 0 THEN 'running' WHEN i % 7 = 0 THEN 'refused' ELSE 'committed' END)::operation_status, now(),
		       CASE WHEN i % 100 = 0 THEN NULL ELSE now() END
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT md5('w' || i)::uuid, 'org_t00000001', 'prod', 'w' || i, '{}', 'index.js', '2025-01-01', 'tsw-' || md5('w' || i),
		       'o', 'd', 'selfhost', 'selfhost', (CASE WHEN i % 2 = 0 THEN 'live' ELSE 'deleted' END)::resource_status, md5('op' || i)::uuid
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name, origin_reservation_id, host_minted,
		canonical_origin, hostname, offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT md5('e' || i)::uuid, 'org_t00000001', 'prod', 'w' || i, md5('w' || i)::uuid, 'w' || i, 'res-' || i, i % 3 = 0,
		       'http://w' || i || '.example', 'w' || i || '.example', 'o', 'd', 'selfhost', 'selfhost',
		       (CASE WHEN i % 2 = 0 THEN 'live' ELSE 'deleted' END)::resource_status, md5('op' || i)::uuid
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO deployments (id, organization_id, resource_kind, resource_uid, generation, native_name, offering_id,
		offering_digest, pack, installation, status)
		SELECT md5('d' || k || i)::uuid, 'org_t00000001', k::resource_kind, md5(CASE k WHEN 'worker' THEN 'w' ELSE 'e' END || i)::uuid, 1, 'n' || i, 'o', 'd', 'selfhost', 'selfhost',
		       (CASE WHEN i % 2 = 0 THEN 'active' ELSE 'deleted' END)::deployment_status
		FROM generate_series(1, $1) i, unnest('{worker,worker-endpoint}'::text[]) k`)
	exec(`INSERT INTO backend_effects (id, operation_id, deployment_id, action, status)
		SELECT md5('x' || d.id)::uuid, md5('op' || (1 + abs(hashtext(d.id::text)) % $1))::uuid, d.id, 'apply', 'succeeded'
		FROM deployments d`)
	exec(`INSERT INTO backend_effects (id, operation_id, deployment_id, action, status, node, parent_id)
		SELECT md5('xm' || x.id)::uuid, x.operation_id, x.deployment_id, x.action, x.status, 'node-1', x.id
		FROM backend_effects x WHERE $1 > 0`)
	exec(`INSERT INTO worker_kept_bundles (deployment_id, worker_uid, modules, main_module, compatibility_date, settings, required_sensitive_vars)
		SELECT d.id, d.resource_uid, '{}', 'index.js', '2025-01-01', '{}', '{}'
		FROM deployments d WHERE d.resource_kind = 'worker' AND $1 > 0`)
	exec(`INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status, closed_at)
		SELECT md5('w' || i)::uuid, 'org_t00000001', 'worker', (CASE WHEN i % 10 = 1 THEN 'open' ELSE 'closed' END)::attestation_status,
		       CASE WHEN i % 10 = 1 THEN NULL ELSE now() END
		FROM generate_series(1, $1, 2) i`)
	exec(`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		canonical_origin, ttl_seconds, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision, endpoint_uid,
		endpoint_revision, offering_id, offering_digest, pack, installation)
		SELECT 'org_t00000001', 'res-' || i, md5('r' || i)::uuid, 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w' || i, 'w' || i,
		       'http://w' || i || '.example', 86400, s.status, now() + CASE WHEN i % 5 = 0 THEN interval '-1 day' ELSE interval '1 day' END,
		       i % 3 = 0, CASE WHEN s.status IN ('bound', 'activated') THEN md5('w' || i)::uuid END,
		       CASE WHEN s.status IN ('bound', 'activated') THEN 1 END,
		       CASE WHEN s.status = 'activated' OR (s.status IN ('bound', 'expired') AND i % 2 = 0) THEN md5('e' || i)::uuid END,
		       CASE WHEN s.status = 'activated' OR (s.status IN ('bound', 'expired') AND i % 2 = 0) THEN 1 END,
		       'o', 'd', 'selfhost', 'selfhost'
		FROM generate_series(1, $1) i,
		     LATERAL (SELECT (ARRAY['released', 'released', 'released', 'expired', 'prepared', 'bound', 'activated']::reservation_status[])[1 + i % 7] AS status) s`)
	exec(`INSERT INTO custom_domains (organization_id, hostname, uid, status, verified_at, next_check_at, pending_until)
		SELECT 'org_t' || lpad((1 + i % ($1 / 10))::text, 8, '0'), 'd' || i || '.example.com', md5('cd' || i)::uuid, s.status,
		       CASE WHEN s.status = 'verified' THEN now() END, now() + (i % 1000) * interval '1 minute', now() + interval '7 days'
		FROM generate_series(1, $1) i,
		     LATERAL (SELECT (ARRAY['pending', 'verified', 'verified', 'failed', 'revoked']::custom_domain_status[])[1 + i % 5] AS status) s`)
	exec(`INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
		SELECT 'org_t00000001', 'worker', 'prod/w' || i, 'token-tenant-' || lpad(i::text, 8, '0'), sha256(i::text::bytea),
		       md5('w' || i)::uuid, 200, '{}'
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO ownership_tombstones (organization_id, kind, external_key, token, object_uid, request_hash, response_status,
		response_body, expires_at)
		SELECT 'org_t00000001', 'worker', 'prod/w' || i, 'token-gone-' || i, md5('w' || i)::uuid, sha256(i::text::bytea), 200, '{}',
		       now() + interval '30 days'
		FROM generate_series(1, $1) i`)
	exec(`INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at)
		SELECT 'org_t00000001', 'worker', 'prod/w' || i, md5('op' || i)::uuid, 'host', now() + interval '1 minute'
		FROM generate_series(10, $1, 10) i`)
	exec(`INSERT INTO runtime_input_preparations (organization_id, operation_id, preparation_id, reference, material_set_nonce,
		material_set_id, space, worker_name, bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin, binding_names,
		sealing_key_id, sealing_nonce, ciphertext, material_digest, digest_key_id, status, expires_at, worker_uid, claim_operation_id,
		claim_expires_at)
		SELECT 'org_t00000001', 'op-' || i, 'prep-' || md5(i::text), 'rip1.prep-' || md5(i::text) || '.' || md5(i::text) || md5(i::text),
		       'n', md5('m' || i)::uuid, 'prod', 'w' || i, 'main', 'w' || i, 'res-' || i, 'http://w' || i || '.example', '{}',
		       CASE WHEN s.status IN ('prepared', 'claimed') THEN 'k' END, CASE WHEN s.status IN ('prepared', 'claimed') THEN '\x00'::bytea END,
		       CASE WHEN s.status IN ('prepared', 'claimed') THEN '\x00'::bytea END,
		       sha256(i::text::bytea), 'k', s.status, now() + interval '1 hour',
		       CASE WHEN s.status NOT IN ('prepared', 'aborted', 'expired') THEN md5('w' || i)::uuid END,
		       CASE WHEN s.status IN ('claimed', 'dispatched', 'settled') THEN md5('op' || i)::uuid END,
		       CASE WHEN s.status = 'claimed' THEN now() + interval '15 minutes' END
		FROM generate_series(1, $1) i,
		     LATERAL (SELECT (ARRAY['settled', 'settled', 'expired', 'aborted', 'prepared', 'claimed', 'dispatched']::runtime_input_status[])[1 + i % 7] AS status) s`)
	// Each worker binds to the next one (a chain of callers across the tenant's workers).
	exec(`INSERT INTO worker_service_bindings (caller_uid, binding, callee_uid)
		SELECT md5('w' || i)::uuid, 'NEXT', md5('w' || (i + 1))::uuid FROM generate_series(1, $1 - 1) i`)
	// Late-write re-checks of a Cloudflare installation, nearly all settled long ago.
	exec(`INSERT INTO late_write_rechecks (deployment_id, organization_id, installation, script_name, worker_uid, due_at, status, settled_at)
		SELECT md5('lw' || i)::uuid, 'org_t00000001', 'cf', 'tsw-' || md5('w' || i), md5('w' || i)::uuid, now(),
		       (CASE WHEN i % 100 = 0 THEN 'pending' ELSE 'removed' END)::late_write_status, now()
		FROM generate_series(1, $1) i`)
}

// argument is a value of typ for EXECUTE: the small organization for text, so that a custom plan
// is made for a tenant with next to nothing beside a tenant with everything; an enum's first value
// (every value, for an array of one).
func argument(typ, org string, enum bool) string {
	if enum {
		if base, ok := strings.CutSuffix(typ, "[]"); ok {
			return "enum_range(NULL::" + base + ")"
		}
		return "(enum_range(NULL::" + typ + "))[1]"
	}
	switch strings.TrimSuffix(typ, "[]") {
	case "text", "character varying":
		if strings.HasSuffix(typ, "[]") {
			return "'{" + org + "}'"
		}
		return "'" + org + "'"
	case "uuid":
		if strings.HasSuffix(typ, "[]") {
			return "'{}'"
		}
		return "gen_random_uuid()"
	case "bigint", "integer", "smallint", "double precision", "numeric":
		return "1"
	case "boolean":
		return "false"
	case "timestamp with time zone":
		return "now()"
	case "bytea":
		return `'\x00'::bytea`
	case "jsonb", "json":
		return "'{}'"
	case "interval":
		return "'1 minute'"
	}
	panic("plan test: no argument for type " + typ)
}

// problems EXPLAINs query under the session's plan_cache_mode and reports what it does wrong: a
// sequential scan of a table that grows with tenants, or the clock read on every row.
func problems(t *testing.T, ctx context.Context, conn *pgxpool.Conn, name, query, org string) []string {
	t.Helper()
	seqscan := "on"
	if strings.HasPrefix(query, "/*seqscan off*/") {
		seqscan = "off"
	}
	_, err := conn.Exec(ctx, "SET enable_seqscan = "+seqscan)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "PREPARE q AS "+query)
	require.NoError(t, err, name)
	defer func() { _, _ = conn.Exec(ctx, "DEALLOCATE q") }()
	var types []string
	require.NoError(t, conn.QueryRow(ctx, "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'q'").Scan(&types))
	args := make([]string, len(types))
	for i, typ := range types {
		var enum bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_type WHERE typname = $1 AND typtype = 'e')", strings.TrimSuffix(typ, "[]")).Scan(&enum))
		args[i] = argument(typ, org, enum)
	}
	execute := "EXECUTE q"
	if len(args) > 0 {
		execute += "(" + strings.Join(args, ", ") + ")"
	}
	var raw []byte
	require.NoError(t, conn.QueryRow(ctx, "EXPLAIN (VERBOSE, FORMAT JSON) "+execute).Scan(&raw), name)
	var plan []map[string]any
	require.NoError(t, json.Unmarshal(raw, &plan))
	var out []string
	var walk func(node map[string]any, initPlan bool)
	walk = func(node map[string]any, initPlan bool) {
		initPlan = initPlan || node["Parent Relationship"] == "InitPlan"
		if node["Node Type"] == "Seq Scan" {
			if rel, _ := node["Relation Name"].(string); !slices.Contains(small, rel) {
				out = append(out, "Seq Scan on "+rel)
			}
		}
		if !initPlan {
			for key, v := range node {
				if key == "Plans" {
					continue
				}
				if strings.Contains(fmt.Sprint(v), "db_now()") {
					out = append(out, "db_now() per row in "+key+": "+fmt.Sprint(v))
				}
			}
		}
		children, _ := node["Plans"].([]any)
		for _, c := range children {
			walk(c.(map[string]any), initPlan)
		}
	}
	walk(plan[0]["Plan"].(map[string]any), false)
	return out
}

// checkPlans EXPLAINs every request-path query, custom and generic, and fails on any problem.
func checkPlans(t *testing.T, ctx context.Context, db *pgxpool.Pool, org string, modes ...string) {
	t.Helper()
	queries := generatedQueries(t)
	for name, q := range extra {
		queries[name] = q
	}
	conn, err := db.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var failures []string
	names := make([]string, 0, len(queries))
	for name := range queries {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, mode := range modes {
		_, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode)
		require.NoError(t, err)
		for _, name := range names {
			if slices.Contains(offPath, name) {
				continue
			}
			for _, p := range problems(t, ctx, conn, name, queries[name], org) {
				failures = append(failures, fmt.Sprintf("%s (%s): %s", name, mode, p))
			}
		}
	}
	require.Empty(t, failures, "request-path queries that scan other tenants' rows or read the clock per row:\n%s", strings.Join(failures, "\n"))
}

func smallOrg(t *testing.T, ctx context.Context, db *pgxpool.Pool) string {
	t.Helper()
	_, err := db.Exec(ctx, `INSERT INTO organizations (id, name) VALUES ('org_smalltenant', 'smalltenant')`)
	require.NoError(t, err)
	return "org_smalltenant"
}

// TestRequestPathPlansUseIndexesBesideOtherTenantsRows: with 20,000 rows of every kind held by
// other tenants, and statistics that know it, no request-path query scans a table that grows with
// tenants, as a custom or as a generic plan, and none reads the clock per row.
func TestRequestPathPlansUseIndexesBesideOtherTenantsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	org := smallOrg(t, ctx, db)
	fill(t, ctx, db, envInt("TAKOFORM_PLAN_ROWS", 20000))
	_, err := db.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	checkPlans(t, ctx, db, org, "force_custom_plan", "force_generic_plan")
}

// TestRequestPathPlansUseIndexesWithEmptyTableStatistics: statistics taken while the tables were
// empty (a fresh Host's first requests, which is when a pooled connection caches its generic
// plans) do not make a request-path query scan the rows that arrive later.
func TestRequestPathPlansUseIndexesWithEmptyTableStatistics(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	org := smallOrg(t, ctx, db)
	var tables []string
	rows, err := db.Query(ctx, `SELECT relname FROM pg_stat_user_tables`)
	require.NoError(t, err)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, table := range tables {
		_, err := db.Exec(ctx, "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" SET (autovacuum_enabled = false)")
		require.NoError(t, err)
	}
	_, err = db.Exec(ctx, "ANALYZE")
	require.NoError(t, err)
	fill(t, ctx, db, envInt("TAKOFORM_PLAN_ROWS", 20000))
	checkPlans(t, ctx, db, org, "force_generic_plan")
}

func envInt(name string, fallback int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return fallback
}
