package host_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// slogTo is a JSON logger into b.
func slogTo(b *runtimetest.Buffer) *slog.Logger { return slog.New(slog.NewJSONHandler(b, nil)) }

// logged are the messages a Host logged into b at level, in order.
func logged(t *testing.T, b *runtimetest.Buffer, level string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m))
		if m["level"] == level {
			out = append(out, m)
		}
	}
	return out
}

// tombstone writes an ownership tombstone of org's worker key that expires at expires (SQL).
func tombstone(t *testing.T, db *pgxpool.Pool, org, key, expires string) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO ownership_tombstones (organization_id, kind, external_key, token, object_uid, request_hash, response_status, response_body, expires_at)
		VALUES ($1, 'worker', $2, 'token-0000000000000001', gen_random_uuid(), '\x00', 200, '\x7b7d', `+expires+`)`, org, key)
	require.NoError(t, err)
}

// A step that fails is logged under its own message and the janitor goes on to the next: with
// the database gone, every step fails and each says so, in the janitor's order.
func TestAFailedStepIsLoggedAndTheOthersStillRun(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t)
	logs := &runtimetest.Buffer{}
	h := host.New(host.Config{DB: db, Logger: slogTo(logs)})
	db.Close()
	h.Sweep(context.Background())
	var got []string
	for _, l := range logged(t, logs, "WARN") {
		got = append(got, l["msg"].(string))
		require.NotEmpty(t, l["error"])
	}
	require.Equal(t, []string{
		"recover operations of expired leases",
		"collect orphaned deployments",
		"re-check scripts a late upload may have landed on",
		"release Host-minted reservations of deleted workers",
		"let go of what stands on revoked custom domains",
		"expire lapsed reservations",
		"close deletion attestations whose route propagation ended",
		"expire runtime inputs",
		"drop the pool blobs of deleted workers",
		"purge tombstones",
		"settle abandoned cron ticks",
		"a runtime node does not answer the Host",                   // the default catalog's node, which no test runs
		"could not put a runtime node back to what the ledger says", // and so it cannot be compared with the ledger
	}, got)
}

// A sweep whose context has ended logs nothing: a stopping Host is not a failing one.
func TestASweepStoppedByItsContextLogsNoFailure(t *testing.T) {
	t.Parallel()
	logs := &runtimetest.Buffer{}
	h := host.New(host.Config{DB: testdb.Pool(t), Logger: slogTo(logs)})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h.Sweep(ctx)
	require.Empty(t, logged(t, logs, "WARN"))
}

// The tombstone step purges the tombstones whose retention ended and keeps the others, and says
// how many it purged.
func TestTheTombstoneStepPurgesOnlyExpiredTombstones(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t)
	ctx := context.Background()
	org, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	tombstone(t, db, org.ID, "prod/old", "now() - interval '1 second'")
	tombstone(t, db, org.ID, "prod/new", "now() + interval '1 day'")
	logs := &runtimetest.Buffer{}
	h := host.New(host.Config{DB: db, Logger: slogTo(logs)})
	h.Sweep(ctx)
	var left []string
	rows, err := db.Query(ctx, `SELECT external_key FROM ownership_tombstones WHERE organization_id = $1`, org.ID)
	require.NoError(t, err)
	for rows.Next() {
		var k string
		require.NoError(t, rows.Scan(&k))
		left = append(left, k)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"prod/new"}, left)
	var purged bool
	for _, l := range logged(t, logs, "INFO") {
		if l["msg"] == "purged expired tombstones" {
			purged = true
			require.EqualValues(t, 1, l["count"])
		}
	}
	require.True(t, purged, "the step says what it purged")
	for _, l := range logged(t, logs, "WARN") {
		require.Contains(t, []string{"reach", "reconcile-nodes"}, l["step"], "only the default catalog's absent node is missing: %v", l)
	}
}

// A replica left running after a newer release migrated the database runs no janitor step: its
// rules are the older ones. It says so, and leaves the rows to the newer replicas.
func TestTheJanitorPausesOnADatabaseNewerThanItself(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t)
	ctx := context.Background()
	org, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	tombstone(t, db, org.ID, "prod/old", "now() - interval '1 second'")
	_, err = db.Exec(ctx, `UPDATE schema_migrations SET version = version + 1`)
	require.NoError(t, err)
	logs := &runtimetest.Buffer{}
	h := host.New(host.Config{DB: db, Logger: slogTo(logs)})
	h.Sweep(ctx)
	warns := logged(t, logs, "WARN")
	require.Len(t, warns, 1, "one warning, no step run")
	require.Equal(t, "janitor paused: the database's schema is newer than this takoserver", warns[0]["msg"])
	var left int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM ownership_tombstones`).Scan(&left))
	require.Equal(t, 1, left, "the expired tombstone is left to a newer replica")
}
