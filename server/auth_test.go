package server_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
)

func TestMissingKeyIsUnauthenticated(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.do(req{method: http.MethodGet, path: "/v1/capabilities"})
	r.problem(t, http.StatusUnauthorized, "unauthenticated")
	require.Contains(t, r.header.Get("WWW-Authenticate"), "Bearer")
}

func TestWrongKeyIsUnauthenticated(t *testing.T) {
	t.Parallel()
	h := setup(t)
	for _, key := range []string{"tkf_" + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "not-a-key", h.key + "x"} {
		h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key}).problem(t, http.StatusUnauthorized, "unauthenticated")
	}
	r := h.do(req{method: http.MethodGet, path: "/v1/capabilities", headers: map[string]string{"Authorization": "Basic " + h.key}})
	r.problem(t, http.StatusUnauthorized, "unauthenticated")
}

func TestRevokedKeyStopsWorkingAtOnce(t *testing.T) {
	t.Parallel()
	h := setup(t)
	key := h.keyWith("acme")
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key.Key}).status)
	require.NoError(t, auth.RevokeKey(context.Background(), h.db, key.ID))
	h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key.Key}).problem(t, http.StatusUnauthorized, "unauthenticated")
	// Revoking again is harmless; other keys of the organization keep working.
	require.NoError(t, auth.RevokeKey(context.Background(), h.db, key.ID))
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: h.key}).status)
}

// TestRevokedKeyStopsWorkingWithinTheCacheTTL: a Host trusts a key that authenticated for a short
// while (one second by default) without asking the database; a revocation reaches it within that.
func TestRevokedKeyStopsWorkingWithinTheCacheTTL(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.keyCacheTTL = 300 * time.Millisecond })
	key := h.keyWith("acme")
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key.Key}).status)
	require.NoError(t, auth.RevokeKey(context.Background(), h.db, key.ID))
	deadline := time.Now().Add(2 * time.Second)
	for h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key.Key}).status == http.StatusOK {
		require.True(t, time.Now().Before(deadline), "the revoked key still works after its cache TTL")
		time.Sleep(50 * time.Millisecond)
	}
	h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: key.Key}).problem(t, http.StatusUnauthorized, "unauthenticated")
}

func TestMissingScopeIsForbidden(t *testing.T) {
	t.Parallel()
	h := setup(t)
	readOnly := h.keyWith("acme", auth.ScopeRead)
	writeOnly := h.keyWith("acme", auth.ScopeWrite)

	r := h.putReservation(readOnly.Key, "res-a", "token-0000000000000001", apiBody("prod", "api"))
	require.Contains(t, r.problem(t, http.StatusForbidden, "forbidden")["detail"], "resources:write")
	require.Zero(t, h.rowCount("true"), "a refused write changes nothing")

	r = h.putReservation(writeOnly.Key, "res-a", "token-0000000000000001", apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	h.getReservation(writeOnly.Key, "res-a").problem(t, http.StatusForbidden, "forbidden")
	require.Equal(t, http.StatusOK, h.getReservation(readOnly.Key, "res-a").status)
}

func TestUnknownScopeIsRefusedAtIssue(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, err := auth.CreateKey(context.Background(), h.db, "acme", []string{"admin"})
	require.ErrorContains(t, err, `unknown scope "admin"`)
}

func TestAnotherOrganizationsObjectsAreNotFound(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, otherKey := h.newOrg("globex")
	token := "token-acme-00000000001"
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", token, apiBody("prod", "api")).status)

	h.getReservation(otherKey, "res-a").problem(t, http.StatusNotFound, "not_found")
	// Deleting with the owner's token from the other organization finds nothing to delete.
	h.deleteReservation(otherKey, "res-a", token).problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, "prepared", h.getReservation(h.key, "res-a").json(t)["status"])

	// Reservation ids are scoped to the organization: the other one may hold its own res-a.
	r := h.putReservation(otherKey, "res-a", "token-globex-0000000001", apiBody("prod", "api"))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.NotEqual(t, h.getReservation(h.key, "res-a").json(t)["canonicalOrigin"], r.json(t)["canonicalOrigin"],
		"the derived label includes the tenant, so the two origins differ")
	require.Equal(t, 2, h.rowCount("id = 'res-a'"))

	// Workers, endpoints, operations and deletion attestations of another organization are not
	// found either, never forbidden.
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-a"})
	created := h.putWorker("prod", "web", "token-worker-web-000001", workerBody())
	op := created.header.Get("Takoform-Operation-Id")
	require.NotEmpty(t, op)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "web", "token-worker-web-000001").status)
	web := created.json(t)["uid"].(string)
	require.Equal(t, http.StatusOK, h.get("/v1/deletion-attestations/"+web).status)
	for _, path := range []string{"/v1/spaces/prod/workers/api", "/v1/spaces/prod/worker-endpoints/api", "/v1/operations/" + op, "/v1/deletion-attestations/" + web} {
		h.do(req{method: http.MethodGet, path: path, key: otherKey}).problem(t, http.StatusNotFound, "not_found")
	}
	h.do(req{method: http.MethodDelete, path: "/v1/spaces/prod/worker-endpoints/api", key: otherKey, token: endpointToken}).problem(t, http.StatusNotFound, "not_found")
	require.Equal(t, true, h.get("/v1/spaces/prod/worker-endpoints/api").json(t)["ready"], e["uid"])
}
