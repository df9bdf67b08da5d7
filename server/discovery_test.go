package server_test

import (
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/server"
)

func TestHealthAndReadinessNeedNoKey(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/healthz"}).status)
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/readyz"}).status)
}

func TestReadinessFailsWithoutDatabase(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.db.Close()
	h.do(req{method: http.MethodGet, path: "/readyz"}).problem(t, http.StatusServiceUnavailable, "unavailable")
}

func TestCapabilitiesAdvertiseOwnership(t *testing.T) {
	t.Parallel()
	h := setup(t)
	c := h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: h.key}).json(t)
	require.Equal(t, []any{"takoform-ownership-v1"}, c["ownership"])
	require.Equal(t, []any{"takoserver.worker-endpoint-origin-reservation.v2"}, c["reservationFormats"])
	require.Equal(t, []any{"selfhost"}, c["packs"])
	require.Equal(t, []any{"takoserver.worker-runtime-input-preparation@v1"}, c["runtimeInputFormats"])
	require.Equal(t, h.org.ID, c["organizationId"])
}

func TestOfferingsListTheDefaultCatalog(t *testing.T) {
	t.Parallel()
	h := setup(t)
	body := h.do(req{method: http.MethodGet, path: "/v1/offerings", key: h.key}).json(t)
	offerings := body["offerings"].([]any)
	require.Len(t, offerings, 2)
	ids := []string{}
	for _, o := range offerings {
		m := o.(map[string]any)
		ids = append(ids, m["id"].(string))
		require.Equal(t, "selfhost", m["pack"])
		require.Len(t, m["digest"], 64)
	}
	require.ElementsMatch(t, []string{"selfhost-module-worker", "selfhost-worker-endpoint"}, ids)
}

func TestUnknownRouteAndMethodAreProblems(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.do(req{method: http.MethodGet, path: "/v1/nothing-here", key: h.key}).problem(t, http.StatusNotFound, "not_found")
	h.do(req{method: http.MethodPost, path: "/healthz"}).problem(t, http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestRequestIDIsAdoptedOrMade(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.do(req{method: http.MethodGet, path: "/v1/capabilities", headers: map[string]string{"X-Request-Id": "trace-123"}})
	require.Equal(t, "trace-123", r.header.Get("X-Request-Id"))
	require.Equal(t, "trace-123", r.problem(t, http.StatusUnauthorized, "unauthenticated")["requestId"])
	r = h.do(req{method: http.MethodGet, path: "/healthz", headers: map[string]string{"X-Request-Id": "bad id\twith spaces"}})
	require.Regexp(t, `^[0-9a-f]{24}$`, r.header.Get("X-Request-Id"))
	require.Contains(t, h.logs.String(), `"request_id":"trace-123"`)
}

func TestMetricsCountRequestsByRouteAndStatus(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: h.key})
	h.do(req{method: http.MethodGet, path: resPath + "res-x", key: h.key})
	m := string(h.do(req{method: http.MethodGet, path: "/metrics"}).body)
	require.Contains(t, m, `takoserver_http_requests_total{method="GET",route="/v1/capabilities",status="200"} 1`)
	require.Contains(t, m, `takoserver_http_requests_total{method="GET",route="/v1/worker-endpoint-origin-reservations/:reservationId",status="404"} 1`)
	require.Contains(t, m, `takoserver_http_request_duration_seconds_bucket{method="GET",route="/v1/capabilities",status="200"`)
	// A problem's code is counted and logged with its request: 429s of a quota and of a rate
	// limit look alike by status alone.
	require.Contains(t, m, `takoserver_http_problems_total{code="not_found",route="/v1/worker-endpoint-origin-reservations/:reservationId"} 1`)
	require.Regexp(t, `"msg":"request"[^\n]*"status":404[^\n]*"code":"not_found"`, h.logs.String())
	// The Host's own measures are on the same page.
	for _, name := range []string{"takoserver_janitor_settled_total", "takoserver_janitor_failures_total", "go_goroutines"} {
		require.Contains(t, m, name)
	}
}

func TestLogsNeverCarryKeysHeadersOrBodies(t *testing.T) {
	t.Parallel()
	h := setup(t)
	canary := "canary-7f3a9c1e5b"
	h.putReservation(h.key, "res-a", tokenA, map[string]any{"space": "prod", "workerName": "api", "subdomain": canary})
	h.putReservation(h.key, "res-b", tokenB, map[string]any{"space": "prod", "workerName": "web", "bogus": canary})
	h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: h.key + canary})
	logs := h.logs.String()
	require.NotEmpty(t, logs)
	for _, secret := range []string{h.key, canary, tokenA, "Authorization", "Bearer"} {
		require.False(t, strings.Contains(logs, secret), "logs must not contain %q", secret)
	}
}

func TestServerErrorsAreGenericAndLogged(t *testing.T) {
	t.Parallel()
	h := setup(t)
	// Break the schema under the Host so a request fails inside the database.
	_, err := h.db.Exec(t.Context(), "ALTER TABLE worker_endpoint_origin_reservations RENAME TO broken")
	require.NoError(t, err)
	r := h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api"))
	p := r.problem(t, http.StatusInternalServerError, "internal")
	require.NotContains(t, string(r.body), "broken")
	require.NotContains(t, string(r.body), "SQLSTATE")
	require.NotContains(t, p["detail"], "worker_endpoint_origin_reservations")
	require.Contains(t, h.logs.String(), `"request_id":"`+p["requestId"].(string)+`"`)
	require.Contains(t, h.logs.String(), "SQLSTATE")
}

func TestEveryErrorCodeHasOneStatus(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("../internal/apierr/apierr.go")
	require.NoError(t, err)
	codes := regexp.MustCompile(`Code = "([a-z_]+)"`).FindAllStringSubmatch(string(raw), -1)
	require.NotEmpty(t, codes)
	for _, c := range codes {
		require.True(t, server.KnownCode(apierr.Code(c[1])), "code %s has no status", c[1])
	}
}
