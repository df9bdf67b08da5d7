package server_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// A replica left running after a newer release migrated the database (issue 34 item 4) never
// answers 500: the first query that meets the changed schema finds the database's version newer
// than its own, answers 503 (retryable: another replica answers), logs both versions once, and
// every API request and /readyz answer 503 from then on, until the database is back at a version
// it knows.
func TestAReplicaOlderThanItsDatabaseAnswers503NeverA500(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	// What a newer release's migration does: a new version, and a table this replica's queries
	// no longer match.
	h.exec(`UPDATE schema_migrations SET version = version + 1`)
	h.exec(`ALTER TABLE workers RENAME COLUMN modules TO bundle`)

	body := workerBody()
	body["modules"] = map[string]string{"index.js": helloModule + "\n// v2"}
	p := h.putWorker("prod", "api", workerToken, body).problem(t, http.StatusServiceUnavailable, "unavailable")
	want := fmt.Sprintf("schema version %d, this replica knows %d", store.SchemaVersion()+1, store.SchemaVersion())
	require.Contains(t, p["detail"], want)
	h.get("/v1/spaces/prod/workers/api").problem(t, http.StatusServiceUnavailable, "unavailable")
	ready := h.do(req{method: http.MethodGet, path: "/readyz"})
	require.Equal(t, http.StatusServiceUnavailable, ready.status, "a load balancer takes the replica out: %s", ready.body)
	require.Equal(t, 1, strings.Count(h.logs.String(), "the database's schema is newer than this takoserver"), "said once")
	require.Contains(t, h.logs.String(), fmt.Sprintf(`"database_schema_version":%d`, store.SchemaVersion()+1))
	require.NotContains(t, h.logs.String(), `"level":"ERROR","msg":"request failed"`, "no 500 was logged")

	// Back at a version it knows (the newer release rolled back): it serves again.
	h.exec(`ALTER TABLE workers RENAME COLUMN bundle TO modules`)
	h.exec(`UPDATE schema_migrations SET version = version - 1`)
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/readyz"}).status)
	require.Equal(t, http.StatusOK, h.get("/v1/spaces/prod/workers/api").status)
}
