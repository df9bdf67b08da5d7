package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReservationProjectionV2(t *testing.T) {
	t.Parallel()
	h := setup(t)
	r := h.putReservation(h.key, "res-api", tokenA, map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": 3600})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	p := r.json(t)
	require.Equal(t, "takoserver.worker-endpoint-origin-reservation.v2", p["format"])
	require.Equal(t, "res-api", p["id"])
	require.Equal(t, "prepared", p["status"])
	require.Equal(t, false, p["hostMinted"])
	require.Nil(t, p["boundWorker"])
	require.Nil(t, p["endpoint"])
	require.Regexp(t, `^api-prod-[0-9a-f]{32}$`, p["subdomain"])
	require.Equal(t, "http://"+p["subdomain"].(string)+".workers.localhost:"+h.edgePort(), p["canonicalOrigin"])
	require.NotEmpty(t, p["expiresAt"])
	for _, placement := range []string{"offeringId", "offeringDigest", "pack", "installation", "placement"} {
		require.NotContains(t, p, placement, "placement is never projected")
	}
	require.Len(t, p, 13)
}

func TestReservationUniquePerWorkerWithinOrganization(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).status)
	h.putReservation(h.key, "res-b", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "other"}).
		problem(t, http.StatusConflict, "reservation_conflict")
	require.Equal(t, 1, h.rowCount("true"))
	// Another worker, or the same worker name in another space, is a different key.
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-b", tokenB, apiBody("staging", "api")).status)
}

func TestReservationOriginHasOneOwnerAcrossOrganizations(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, otherKey := h.newOrg("globex")
	body := map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, body).status)
	h.putReservation(otherKey, "res-z", tokenB, body).problem(t, http.StatusConflict, "origin_taken")
	require.Equal(t, 1, h.rowCount("true"))
}

func TestReservationHostMintNamespaceIsRefusedToWrites(t *testing.T) {
	t.Parallel()
	h := setup(t)
	id := "hostmint-189331124caba810f34f3df5b2c5894b52b1bb96"
	h.putReservation(h.key, id, tokenA, apiBody("prod", "api")).problem(t, http.StatusForbidden, "hostmint_namespace")
	h.deleteReservation(h.key, id, tokenA).problem(t, http.StatusForbidden, "hostmint_namespace")
	// Reads are allowed (the owning organization sees its minted rows; here there is none).
	h.getReservation(h.key, id).problem(t, http.StatusNotFound, "not_found")
	require.Zero(t, h.rowCount("true"))
}

func TestReservationBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	cases := []struct {
		name   string
		id     string
		body   any
		ct     string
		status int
		code   string
	}{
		{"unknown field", "res-a", map[string]any{"space": "prod", "workerName": "api", "origin": "http://x"}, "", 400, "bad_request"},
		{"not json", "res-a", "{", "", 400, "bad_request"},
		{"trailing data", "res-a", `{"space":"prod","workerName":"api"} {}`, "", 400, "bad_request"},
		{"wrong type", "res-a", map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": "1h"}, "", 400, "bad_request"},
		{"not json content type", "res-a", `{"space":"prod","workerName":"api"}`, "text/plain", 415, "unsupported_media_type"},
		{"invalid space", "res-a", apiBody("Prod", "api"), "", 422, "invalid_request"},
		{"invalid worker", "res-a", apiBody("prod", "-api"), "", 422, "invalid_request"},
		{"ttl too short", "res-a", map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": 1}, "", 422, "invalid_request"},
		{"ttl too long", "res-a", map[string]any{"space": "prod", "workerName": "api", "ttlSeconds": 999999999}, "", 422, "invalid_request"},
		{"subdomain not a label", "res-a", map[string]any{"space": "prod", "workerName": "api", "subdomain": "a.b"}, "", 422, "invalid_request"},
		{"subdomain uppercase", "res-a", map[string]any{"space": "prod", "workerName": "api", "subdomain": "Shop"}, "", 422, "invalid_request"},
		{"unknown offering", "res-a", map[string]any{"space": "prod", "workerName": "api", "offeringId": "nope"}, "", 422, "offering_unknown"},
		{"endpoint offering for a worker", "res-a", map[string]any{"space": "prod", "workerName": "api", "offeringId": "selfhost-worker-endpoint"}, "", 422, "offering_unknown"},
		{"invalid id", "Res_A", apiBody("prod", "api"), "", 422, "invalid_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := h.do(req{method: http.MethodPut, path: resPath + c.id, key: h.key, token: tokenA, body: c.body, contentType: c.ct})
			r.problem(t, c.status, c.code)
		})
	}
	require.Zero(t, h.rowCount("true"))
	var bindings int
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM ownership_bindings").Scan(&bindings))
	require.Zero(t, bindings)
}

func TestReservationBodyLimit(t *testing.T) {
	t.Parallel()
	h := setup(t)
	huge := `{"space":"prod","workerName":"api","subdomain":"` + strings.Repeat("a", 1<<20) + `"}`
	h.putReservation(h.key, "res-a", tokenA, huge).problem(t, http.StatusRequestEntityTooLarge, "body_too_large")
	require.Zero(t, h.rowCount("true"))
}

func TestReservationOfferingSelection(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{
	  "installations": [
	    {"name": "local", "pack": "selfhost"},
	    {"name": "cf", "pack": "workers-dev", "accountSubdomain": "acme"}
	  ],
	  "offerings": [
	    {"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
	    {"id": "cf-worker", "kind": "module-worker", "installation": "cf", "soldTo": ["acme"]}
	  ]
	}`
	})

	h.putReservation(h.key, "res-a", tokenA, apiBody("prod", "api")).problem(t, http.StatusUnprocessableEntity, "offering_ambiguous")
	require.Zero(t, h.rowCount("true"))

	r := h.putReservation(h.key, "res-a", tokenA, map[string]any{"space": "prod", "workerName": "api", "offeringId": "cf-worker"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	require.Regexp(t, `^https://api-prod-[0-9a-f]{32}\.acme\.workers\.dev$`, r.json(t)["canonicalOrigin"])
	var pack, digest string
	require.NoError(t, h.db.QueryRow(context.Background(), "SELECT pack, offering_digest FROM worker_endpoint_origin_reservations WHERE id = 'res-a'").Scan(&pack, &digest))
	require.Equal(t, "workers-dev", pack)
	require.Len(t, digest, 64)

	// An organization the cf offering is not sold to sees one eligible offering: no ambiguity.
	_, otherKey := h.newOrg("globex")
	require.Equal(t, http.StatusCreated, h.putReservation(otherKey, "res-a", tokenB, apiBody("prod", "api")).status)
}

func TestReservationExpiresLazily(t *testing.T) {
	t.Parallel()
	h := setup(t)
	created := h.putReservation(h.key, "res-a", tokenA, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"})
	require.Equal(t, http.StatusCreated, created.status)
	_, err := h.db.Exec(context.Background(), "UPDATE worker_endpoint_origin_reservations SET expires_at = now() - interval '1 second'")
	require.NoError(t, err)

	// A conflicting write sweeps the row first, so the worker key and the origin are free again.
	r := h.putReservation(h.key, "res-b", tokenB, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	got := h.getReservation(h.key, "res-a").json(t)
	require.Equal(t, "expired", got["status"])
	require.EqualValues(t, 2, got["revision"])

	// An expired row without a witness can be released.
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-a", tokenA).status)
}

func TestReservationExpiredRowWithWitnessStillHoldsTheOrigin(t *testing.T) {
	t.Parallel()
	h := setup(t)
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-a", tokenA, map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}).status)
	// An expired row that retains an endpoint witness keeps both uniqueness rules.
	_, err := h.db.Exec(context.Background(), `UPDATE worker_endpoint_origin_reservations
		SET status = 'expired', endpoint_uid = gen_random_uuid(), endpoint_revision = 1`)
	require.NoError(t, err)
	h.putReservation(h.key, "res-b", tokenB, map[string]any{"space": "staging", "workerName": "api", "subdomain": "shop"}).
		problem(t, http.StatusConflict, "origin_taken")
	h.putReservation(h.key, "res-c", "token-cccccccccccccccc", map[string]any{"space": "prod", "workerName": "api", "subdomain": "other"}).
		problem(t, http.StatusConflict, "reservation_conflict")
	// Its endpoint's deletion is still open: release is fenced, naming the fence.
	_, err = h.db.Exec(context.Background(), `INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status)
		SELECT endpoint_uid, organization_id, 'worker-endpoint', 'open' FROM worker_endpoint_origin_reservations WHERE id = 'res-a'`)
	require.NoError(t, err)
	p := h.deleteReservation(h.key, "res-a", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Equal(t, []any{"attestation_open"}, p["unmetFences"])

	// Once the attestation closes the witness is provably gone and release succeeds.
	_, err = h.db.Exec(context.Background(), "UPDATE deletion_attestations SET status = 'closed', closed_at = now()")
	require.NoError(t, err)
	require.Equal(t, "released", h.deleteReservation(h.key, "res-a", tokenA).json(t)["status"])
}
