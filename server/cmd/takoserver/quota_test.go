package main_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// TestOrgsQuotaShowsAndChangesTheCeilingsARunningHostApplies: the command shows an
// organization's effective ceilings (the config file's defaults, its overrides) and what it
// holds; an override it sets is what a running Host refuses at on the next create, and "default"
// gives the catalog's ceiling back.
func TestOrgsQuotaShowsAndChangesTheCeilingsARunningHostApplies(t *testing.T) {
	t.Parallel()
	url, key := migratedWithKey(t)
	config := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(config, []byte(`{
  "installations": [{"name": "selfhost", "pack": "selfhost"}],
  "offerings": [{"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": ["*"]}],
  "quotas": {"reservations": 1}
}`), 0o600))

	quotas := func(args ...string) map[string]any {
		t.Helper()
		out := decodeJSON(t, run(t, url, append([]string{"orgs", "quota", "acme", "--config", config, "--output", "json"}, args...)...))
		require.Equal(t, "acme", out["organization"].(map[string]any)["name"])
		return out["quotas"].(map[string]any)
	}
	require.Equal(t, map[string]any{
		"workers":       map[string]any{"resource": "workers", "ceiling": 100.0, "override": false, "used": 0.0},
		"endpoints":     map[string]any{"resource": "endpoints", "ceiling": 100.0, "override": false, "used": 0.0},
		"reservations":  map[string]any{"resource": "reservations", "ceiling": 1.0, "override": false, "used": 0.0},
		"runtimeInputs": map[string]any{"resource": "runtimeInputs", "ceiling": 100.0, "override": false, "used": 0.0},
		"customDomains": map[string]any{"resource": "customDomains", "ceiling": 20.0, "override": false, "used": 0.0},
	}, quotas(), "the config file's default, else the built-in ones")

	h := startHost(t, url, sealingKey(t), "--config", config)
	res := h.url + "/v1/worker-endpoint-origin-reservations/"
	a, err := put(res+"res-a", key, "token-quota-000000000a", `{"space":"prod","workerName":"a"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, a.status, a.body)
	b, err := put(res+"res-b", key, "token-quota-000000000b", `{"space":"prod","workerName":"b"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, b.status, b.body)
	require.Contains(t, b.body, `"quota":{"ceiling":1,"resource":"reservations","used":1}`)

	got := quotas("--reservations", "2", "--workers", "0", "--custom-domains", "3")
	require.Equal(t, map[string]any{"resource": "customDomains", "ceiling": 3.0, "override": true, "used": 0.0}, got["customDomains"])
	require.Equal(t, map[string]any{"resource": "reservations", "ceiling": 2.0, "override": true, "used": 1.0}, got["reservations"])
	require.Equal(t, map[string]any{"resource": "workers", "ceiling": 0.0, "override": true, "used": 0.0}, got["workers"])
	b, err = put(res+"res-b", key, "token-quota-000000000b", `{"space":"prod","workerName":"b"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, b.status, "the running Host applies the override at once: %s", b.body)
	w, err := put(h.url+"/v1/spaces/prod/workers/api", key, "token-quota-worker-0001", `{"modules":{"index.js":"export default {}"},"mainModule":"index.js","compatibilityDate":"2025-01-01","requiredSensitiveVars":[]}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusTooManyRequests, w.status, "a ceiling of 0 refuses every create: %s", w.body)

	got = quotas("--reservations", "default")
	require.Equal(t, map[string]any{"resource": "reservations", "ceiling": 1.0, "override": false, "used": 2.0}, got["reservations"], "default gives the catalog's back; what stands stays")
	require.Equal(t, 0.0, got["workers"].(map[string]any)["ceiling"], "the other override stays")
	require.Contains(t, run(t, url, "orgs", "quota", "acme", "--config", config), "reservations   2 of 1 (the catalog's default)")
	// Without the catalog the defaults shown are the built-in ones, and the text says so.
	require.Contains(t, run(t, url, "orgs", "quota", "acme"), "(built-in default: pass --config or set TAKOSERVER_CONFIG to show the catalog's)")

	for _, bad := range [][]string{{"--workers", "-1"}, {"--workers", "many"}} {
		_, errOut, err := runRaw(url, append([]string{"orgs", "quota", "acme"}, bad...)...)
		require.Error(t, err)
		require.Contains(t, errOut, "a ceiling is a number from 0 to")
	}
	_, errOut, err := runRaw(url, "orgs", "quota", "nobody")
	require.Error(t, err)
	require.Contains(t, errOut, `no organization named "nobody"`)
}

// TestOrgsCountersFindsADriftAndRecountRepairsIt: with the counters matching, the command says so;
// a reservation written past a disabled trigger is a difference it names (and fails on), and
// --recount makes the counters from the rows again so that it passes.
func TestOrgsCountersFindsADriftAndRecountRepairsIt(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	run(t, url, "migrate", "up")
	run(t, url, "orgs", "create", "acme")
	require.Contains(t, run(t, url, "orgs", "counters"), "the quota counters match every organization's rows")

	db, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer db.Close()
	for _, sql := range []string{
		`ALTER TABLE worker_endpoint_origin_reservations DISABLE TRIGGER worker_endpoint_origin_reservations_usage`,
		`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
			canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		 SELECT o.id, 'res-unseen', gen_random_uuid(), 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w', 'w',
			'http://w.example', 86400, 'prepared', now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost'
		 FROM organizations o WHERE o.name = 'acme'`,
		`ALTER TABLE worker_endpoint_origin_reservations ENABLE TRIGGER worker_endpoint_origin_reservations_usage`,
	} {
		_, err = db.Exec(context.Background(), sql)
		require.NoError(t, err)
	}
	out, _, err := runRaw(url, "orgs", "counters")
	require.Error(t, err, "a difference fails the command")
	require.Contains(t, out, "reservations   counters 0, rows 1")

	report := decodeJSON(t, run(t, url, "orgs", "counters", "--recount", "--output", "json"))
	require.EqualValues(t, 1, report["recounted"])
	require.Empty(t, report["drift"])
	require.Contains(t, run(t, url, "orgs", "counters"), "the quota counters match every organization's rows")
}
