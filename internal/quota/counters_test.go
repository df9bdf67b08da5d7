package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// counters is a database with one organization and an operation its rows can name.
type counters struct {
	db  *pgxpool.Pool
	org string
}

func newCounters(t *testing.T) counters {
	t.Helper()
	ctx := context.Background()
	db, err := pgxpool.New(ctx, testdb.URL(t)+"&pool_max_conns=30")
	require.NoError(t, err)
	t.Cleanup(db.Close)
	org, err := auth.CreateOrganization(ctx, db, "counted")
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO operations (id, organization_id, kind, external_key, method, status, finished_at)
		VALUES ('00000000-0000-0000-0000-000000000001', $1, 'worker', 'x', 'PUT', 'committed', now())`, org.ID)
	require.NoError(t, err)
	return counters{db: db, org: org.ID}
}

// rows are the statements that write one row of each resource in a status, named by $3.
var rows = map[quota.Resource]string{
	quota.Workers: `INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		offering_id, offering_digest, pack, installation, status, operation_id)
		VALUES (gen_random_uuid(), $1, 'prod', $3, '{}', 'index.js', '2025-01-01', $3, 'o', 'd', 'selfhost', 'selfhost', $2,
		'00000000-0000-0000-0000-000000000001')`,
	// An endpoint names a worker: a deleted one (it counts for nothing), made in the same statement.
	quota.Endpoints: `WITH w AS (
		INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		offering_id, offering_digest, pack, installation, status, operation_id)
		VALUES (gen_random_uuid(), $1, 'for-endpoints', 'ew-' || $3, '{}', 'index.js', '2025-01-01', 'e-' || $3, 'o', 'd', 'selfhost', 'selfhost',
		'deleted', '00000000-0000-0000-0000-000000000001') RETURNING uid)
		INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name, origin_reservation_id,
		host_minted, canonical_origin, hostname, offering_id, offering_digest, pack, installation, status, operation_id)
		SELECT gen_random_uuid(), $1, 'prod', $3, w.uid, 'ew-' || $3, 'res-' || $3, false, 'http://' || $3 || '.example',
		$3 || '.example', 'o', 'd', 'selfhost', 'selfhost', $2, '00000000-0000-0000-0000-000000000001' FROM w`,
	quota.Reservations: `INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name,
		subdomain, canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		VALUES ($1, $3, gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', $3, $3,
		'http://' || $3 || '.example', 86400, $2, now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost')`,
	quota.RuntimeInputs: `INSERT INTO runtime_input_preparations (organization_id, operation_id, preparation_id, reference,
		material_set_nonce, material_set_id, space, worker_name, bundle_name, endpoint_name, origin_reservation_id,
		canonical_public_origin, binding_names, material_digest, digest_key_id, status, expires_at, ciphertext, sealing_nonce,
		sealing_key_id, worker_uid)
		VALUES ($1, $3, 'prep-' || md5($3), 'rip1.prep-' || md5($3) || '.' || md5($3) || md5($3), 'n', gen_random_uuid(), 'prod',
		$3, 'main', $3, 'res-' || $3, 'http://' || $3 || '.example', '{}', decode(md5($3) || md5($3), 'hex'), 'k', $2::text::runtime_input_status,
		now() + interval '1 hour', CASE WHEN $2::text IN ('prepared', 'claimed') THEN '\x00'::bytea END,
		CASE WHEN $2::text IN ('prepared', 'claimed') THEN '\x00'::bytea END, CASE WHEN $2::text IN ('prepared', 'claimed') THEN 'k' END,
		CASE WHEN $2::text IN ('claimed', 'dispatched', 'settled') THEN gen_random_uuid() END)`,
}

// statuses are, per resource, a status that counts, one the row moves to and still counts (where
// there is one), and one that does not count.
var statuses = map[quota.Resource][3]string{
	quota.Workers:       {"creating", "live", "deleted"},
	quota.Endpoints:     {"creating", "live", "deleted"},
	quota.Reservations:  {"prepared", "bound", "released"},
	quota.RuntimeInputs: {"prepared", "claimed", "aborted"},
}

// moved are the columns a status move sets beside it, where a check ties them to the status ($4:
// the status as text; $3, the same, is the column's enum).
var moved = map[quota.Resource]string{
	quota.Reservations: `, bound_worker_uid = CASE WHEN $4::text = 'bound' THEN gen_random_uuid() END,
		bound_worker_revision = CASE WHEN $4::text = 'bound' THEN 1 END`,
	quota.RuntimeInputs: `, ciphertext = CASE WHEN $4::text IN ('prepared', 'claimed') THEN '\x00'::bytea END,
		sealing_nonce = CASE WHEN $4::text IN ('prepared', 'claimed') THEN '\x00'::bytea END,
		sealing_key_id = CASE WHEN $4::text IN ('prepared', 'claimed') THEN 'k' END,
		worker_uid = CASE WHEN $4::text = 'claimed' THEN gen_random_uuid() END`,
}

// tables name each resource's table.
var tables = map[quota.Resource]string{
	quota.Workers: "workers", quota.Endpoints: "worker_endpoints",
	quota.Reservations: "worker_endpoint_origin_reservations", quota.RuntimeInputs: "runtime_input_preparations",
}

// names name each resource's row key column.
var names = map[quota.Resource]string{
	quota.Workers: "name", quota.Endpoints: "name", quota.Reservations: "id", quota.RuntimeInputs: "operation_id",
}

// TestTheCountersFollowEveryWriteThatChangesWhatCounts: inserts in counted and uncounted statuses,
// moves between counted statuses, into and out of counted ones, a rolled-back transaction and a
// rolled-back subtransaction: after each, every resource's counters sum to what its rows' statuses
// say (quota.CheckCounters finds no drift) and to the number the test expects.
func TestTheCountersFollowEveryWriteThatChangesWhatCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCounters(t)
	counted := func(r quota.Resource) int64 {
		t.Helper()
		var n int64
		require.NoError(t, c.db.QueryRow(ctx, `SELECT coalesce(sum(held), 0) FROM organization_usage WHERE organization_id = $1 AND resource = $2`,
			c.org, string(r)).Scan(&n))
		return n
	}
	noDrift := func() {
		t.Helper()
		drift, err := quota.CheckCounters(ctx, c.db)
		require.NoError(t, err)
		require.Empty(t, drift)
	}
	for _, r := range quota.Resources {
		st := statuses[r]
		exec := func(sql string, args ...any) {
			t.Helper()
			_, err := c.db.Exec(ctx, sql, args...)
			require.NoError(t, err, r)
		}
		move := func(name, status string) {
			t.Helper()
			exec(`UPDATE `+tables[r]+` SET status = $3`+moved[r]+` WHERE organization_id = $1 AND `+names[r]+` = $2 AND $4::text IS NOT NULL`, c.org, name, status, status)
		}
		exec(rows[r], c.org, st[0], "row-a")
		exec(rows[r], c.org, st[0], "row-b")
		exec(rows[r], c.org, st[2], "row-gone")
		require.EqualValues(t, 2, counted(r), r)
		noDrift()

		move("row-a", st[1]) // counted to counted
		require.EqualValues(t, 2, counted(r), r)
		move("row-b", st[2]) // out
		require.EqualValues(t, 1, counted(r), r)
		if r == quota.Reservations {
			move("row-gone", st[0]) // back in: a released reservation's id taken again
			require.EqualValues(t, 2, counted(r), r)
			move("row-gone", st[2])
		}
		noDrift()

		// A rolled-back transaction and a rolled-back subtransaction leave nothing counted.
		tx, err := c.db.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, rows[r], c.org, st[0], "row-rolled-back")
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.NoError(t, pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, rows[r], c.org, st[0], "row-kept"); err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, rows[r], c.org, st[0], "row-undone"); err != nil {
				return err
			}
			return sp.Rollback(ctx)
		}))
		require.EqualValues(t, 2, counted(r), r)
		noDrift()
	}

	// A write that gets past the triggers is drift, and CheckCounters names it.
	_, err := c.db.Exec(ctx, `ALTER TABLE workers DISABLE TRIGGER workers_usage`)
	require.NoError(t, err)
	_, err = c.db.Exec(ctx, rows[quota.Workers], c.org, "live", "unseen")
	require.NoError(t, err)
	drift, err := quota.CheckCounters(ctx, c.db)
	require.NoError(t, err)
	require.Equal(t, []quota.Drift{{OrganizationID: c.org, Resource: quota.Workers, Counters: 2, Rows: 3}}, drift)
}

// TestAQuotaCheckFarBelowTheCeilingReadsNoneOfTheOrganizationsRows: with 3,000 live reservations
// and a ceiling lifted far above them, a create's quota step reads the counters and no reservation
// row (the transaction's own table statistics say so); near the ceiling it counts the rows, and
// refuses at the ceiling exactly.
func TestAQuotaCheckFarBelowTheCeilingReadsNoneOfTheOrganizationsRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCounters(t)
	_, err := c.db.Exec(ctx, `INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name,
		subdomain, canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		SELECT $1, 'res-' || i, gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w' || i, 'w' || i,
		       'http://w' || i || '.example', 86400, 'prepared', now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost'
		FROM generate_series(1, 3000) i`, c.org)
	require.NoError(t, err)
	// rowsRead is what the check read of the reservations table in its own transaction.
	rowsRead := func(ceiling int) (int64, error) {
		var read int64
		err := pgx.BeginFunc(ctx, c.db, func(tx pgx.Tx) error {
			if err := quota.Check(ctx, tx, quota.Ceilings{Reservations: ceiling}, c.org, quota.Reservations); err != nil {
				return err
			}
			return tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
				WHERE relname = 'worker_endpoint_origin_reservations'`).Scan(&read)
		})
		return read, err
	}
	read, err := rowsRead(100_000)
	require.NoError(t, err)
	require.Zero(t, read, "far below the ceiling the counters decide")

	read, err = rowsRead(3_020)
	require.NoError(t, err)
	require.GreaterOrEqual(t, read, int64(3000), "within 32 of the ceiling the rows are counted")
	_, err = rowsRead(3_000)
	require.ErrorContains(t, err, "quota_exceeded")
	_, err = rowsRead(3_001)
	require.NoError(t, err)
}

// TestAWriteThatFreesACountNeverWaitsOnTheCreatesInFlight: with all 16 slots held by creates that
// have each inserted a row (and so written their slot's counter shard), a release of another
// reservation commits at once: it writes a shard of its own, never a row a create has locked.
func TestAWriteThatFreesACountNeverWaitsOnTheCreatesInFlight(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCounters(t)
	_, err := c.db.Exec(ctx, rows[quota.Reservations], c.org, "prepared", "row-old")
	require.NoError(t, err)
	var holders []pgx.Tx
	t.Cleanup(func() {
		for _, tx := range holders {
			_ = tx.Rollback(ctx)
		}
	})
	for i := range 16 {
		tx, err := c.db.Begin(ctx)
		require.NoError(t, err)
		holders = append(holders, tx)
		require.NoError(t, quota.Check(ctx, tx, quota.Ceilings{Reservations: 1000}, c.org, quota.Reservations))
		_, err = tx.Exec(ctx, rows[quota.Reservations], c.org, "prepared", "row-new-"+string(rune('a'+i)))
		require.NoError(t, err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err = pgx.BeginFunc(wctx, c.db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(wctx, `SET LOCAL lock_timeout = '2s'`); err != nil {
			return err
		}
		_, err := tx.Exec(wctx, `UPDATE worker_endpoint_origin_reservations SET status = 'released' WHERE organization_id = $1 AND id = 'row-old'`, c.org)
		return err
	})
	require.NoError(t, err, "the release waited on a create in flight")
	for _, tx := range holders {
		require.NoError(t, tx.Commit(ctx))
	}
	holders = nil
	drift, err := quota.CheckCounters(ctx, c.db)
	require.NoError(t, err)
	require.Empty(t, drift)
}

// TestTheJanitorStoresLapsedReservationsExpiredSoTheyStopCounting: reservations whose TTL passed
// without publishing count in the counters until a write stores their expiry; the janitor's step
// stores it for every one of them, in batches, and leaves a live one and a lapsed one that
// published (its endpoint stands on it) as they are. The counters then match the rows again.
func TestTheJanitorStoresLapsedReservationsExpiredSoTheyStopCounting(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := newCounters(t)
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := c.db.Exec(ctx, sql, args...)
		require.NoError(t, err)
	}
	// 1,200 lapsed (three batches), one live, one lapsed that published.
	exec(`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		SELECT $1, 'lapsed-' || i, gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w' || i, 'w' || i,
		       'http://w' || i || '.example', 60, 'prepared', now() - interval '1 minute', 'o', 'd', 'selfhost', 'selfhost'
		FROM generate_series(1, 1200) i`, c.org)
	exec(rows[quota.Reservations], c.org, "prepared", "row-live")
	exec(`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation,
		bound_worker_uid, bound_worker_revision, endpoint_uid, endpoint_revision)
		VALUES ($1, 'row-published', gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'pub', 'pub',
		       'http://pub.example', 60, 'bound', now() - interval '1 minute', 'o', 'd', 'selfhost', 'selfhost',
		       gen_random_uuid(), 1, gen_random_uuid(), 1)`, c.org)
	// Its witness: an endpoint that stands (a live endpoint of a committed operation).
	exec(rows[quota.Endpoints], c.org, "live", "row-pub-endpoint")
	exec(`UPDATE worker_endpoint_origin_reservations SET endpoint_uid = (SELECT uid FROM worker_endpoints
		WHERE organization_id = $1 AND name = 'row-pub-endpoint') WHERE organization_id = $1 AND id = 'row-published'`, c.org)
	counted := func() (n int64) {
		t.Helper()
		require.NoError(t, c.db.QueryRow(ctx, `SELECT coalesce(sum(held), 0) FROM organization_usage WHERE organization_id = $1 AND resource = 'reservations'`, c.org).Scan(&n))
		return n
	}
	require.EqualValues(t, 1202, counted(), "lapsed reservations count until their expiry is stored")

	n, err := (&reservation.Service{}).ExpireLapsed(ctx, c.db)
	require.NoError(t, err)
	require.EqualValues(t, 1200, n)
	require.EqualValues(t, 2, counted())
	var expired int
	require.NoError(t, c.db.QueryRow(ctx, `SELECT count(*) FROM worker_endpoint_origin_reservations
		WHERE organization_id = $1 AND status = 'expired'`, c.org).Scan(&expired))
	require.Equal(t, 1200, expired, "the live one and the published one are untouched")
	n, err = (&reservation.Service{}).ExpireLapsed(ctx, c.db)
	require.NoError(t, err)
	require.Zero(t, n, "a second pass finds nothing")
	drift, err := quota.CheckCounters(ctx, c.db)
	require.NoError(t, err)
	require.Empty(t, drift)
}
