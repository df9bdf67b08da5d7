package server_test

import (
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const commitmentKeysPath = "/v1/runtime-input-commitment-keys"

type commitment struct {
	secretID string
	key      []byte
}

// commitmentKey asks the Host for the commitment key of a nonce, with a write key.
func (h *harness) commitmentKey(key, nonce string) commitment {
	h.t.Helper()
	r := h.do(req{method: http.MethodPost, path: commitmentKeysPath, key: key, body: map[string]any{"materialSetNonce": nonce}})
	require.Equal(h.t, http.StatusOK, r.status, "body: %s", r.body)
	got := r.json(h.t)
	k, err := hex.DecodeString(got["commitmentKey"].(string))
	require.NoError(h.t, err)
	return commitment{secretID: got["commitmentSecretId"].(string), key: k}
}

// TestRuleACommitmentKeyIsAWriteKeysAndTheSameEveryTime (SPEC 3.5, rip2): the key is answered
// only to a key that may write, uncached, identical on every ask, and distinct per organization
// and per nonce; it is written nowhere.
func TestRuleACommitmentKeyIsAWriteKeysAndTheSameEveryTime(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, otherKey := h.newOrg("globex")
	reader := h.keyWith(h.org.Name, "resources:read").Key

	first := h.do(req{method: http.MethodPost, path: commitmentKeysPath, key: h.key, body: map[string]any{"materialSetNonce": "n-1"}})
	require.Equal(t, http.StatusOK, first.status, "body: %s", first.body)
	require.Equal(t, "no-store", first.header.Get("Cache-Control"))
	got := first.json(t)
	require.Equal(t, runtimeref.CommitmentKeyFormat, got["format"])
	require.Regexp(t, `^`+runtimeref.SecretIDPattern+`$`, got["commitmentSecretId"])
	require.Regexp(t, `^[0-9a-f]{64}$`, got["commitmentKey"])

	again := h.commitmentKey(h.key, "n-1")
	require.Equal(t, got["commitmentKey"], hex.EncodeToString(again.key), "the same organization and nonce get the same key")
	require.NotEqual(t, again.key, h.commitmentKey(h.key, "n-2").key, "another nonce, another key")
	require.NotEqual(t, again.key, h.commitmentKey(otherKey, "n-1").key, "another organization, another key")

	h.do(req{method: http.MethodPost, path: commitmentKeysPath, key: reader, body: map[string]any{"materialSetNonce": "n-1"}}).
		problem(t, http.StatusForbidden, "forbidden")
	h.do(req{method: http.MethodPost, path: commitmentKeysPath, key: h.key, body: map[string]any{"materialSetNonce": ""}}).
		problem(t, http.StatusUnprocessableEntity, "invalid_request")

	// Written nowhere: only the wrapped secret is in the database, and no key answered is.
	var rows int
	require.NoError(t, h.db.QueryRow(t.Context(), "SELECT count(*) FROM runtime_input_commitment_secrets").Scan(&rows))
	require.Equal(t, 1, rows)
	for _, text := range []string{h.pgDump(), h.logs.String()} {
		require.NotContains(t, text, hex.EncodeToString(again.key))
		require.NotContains(t, text, base64.StdEncoding.EncodeToString(again.key))
	}
}

// pgDump is the database's whole content, as pg_dump writes it.
func (h *harness) pgDump() string {
	h.t.Helper()
	bin, err := pgcluster.BinDir()
	require.NoError(h.t, err)
	dump, err := exec.Command(filepath.Join(bin, "pg_dump"), "--data-only", "--inserts", h.dbURL).CombinedOutput()
	require.NoError(h.t, err, string(dump))
	return string(dump)
}

// TestRuleARip2ReferenceIsCheckedUnderTheSecretItNames: the Host recomputes a rip2 reference with
// the commitment key of the secret the reference names, the caller's organization and the nonce;
// a reference under a secret it does not hold, under another organization's key, or over other
// values is reference_mismatch, and nothing is sealed. A rip1 reference (older providers) is
// still accepted, and still settles.
func TestRuleARip2ReferenceIsCheckedUnderTheSecretItNames(t *testing.T) {
	t.Parallel()
	h := setup(t)
	_, otherKey := h.newOrg("globex")
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	origin := h.getReservation(h.key, "res-api").json(t)["canonicalOrigin"].(string)
	target := runtimeinput.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api", OriginReservationID: "res-api", CanonicalPublicOrigin: origin}
	bindings := map[string]string{"API_KEY": secretCanary}
	put := func(op, reference string) reply {
		return h.do(req{method: http.MethodPut, path: prepPath(h.org.ID, op), key: h.key, token: "token-prepare-00000001", body: map[string]any{
			"format": runtimeinput.PreparationFormat, "materialSetNonce": "n", "runtimeInputReference": reference,
			"target":   map[string]any{"space": "prod", "workerName": "api", "bundleName": "main", "endpointName": "api", "originReservationId": "res-api"},
			"bindings": bindings,
		}})
	}
	mine := h.commitmentKey(h.key, "n")
	theirs := h.commitmentKey(otherKey, "n")
	for name, ref := range map[string]string{
		"another organization's key":      runtimeref.DeriveV2(theirs.key, theirs.secretID, "n", target, bindings).Reference,
		"a secret the Host does not hold": runtimeref.DeriveV2(mine.key, "c20200101000000-00000000", "n", target, bindings).Reference,
		"other values":                    runtimeref.DeriveV2(mine.key, mine.secretID, "n", target, map[string]string{"API_KEY": "hunter2"}).Reference,
		"another nonce's key":             runtimeref.DeriveV2(h.commitmentKey(h.key, "m").key, mine.secretID, "n", target, bindings).Reference,
	} {
		r := put("op-1", ref)
		r.problem(t, http.StatusUnprocessableEntity, "reference_mismatch")
		require.NotContains(t, string(r.body), secretCanary, name)
		require.Zero(t, h.countRows("runtime_input_preparations"), name)
	}

	ref := runtimeref.DeriveV2(mine.key, mine.secretID, "n", target, bindings).Reference
	created := put("op-1", ref)
	require.Equal(t, http.StatusCreated, created.status, "body: %s", created.body)
	require.Equal(t, ref, created.json(t)["runtimeInputReference"])
	require.Equal(t, http.StatusOK, h.get("/v1/worker-runtime-input-references/"+ref).status)

	legacy := runtimeinput.Derive("n", target, map[string]vocab.Secret{"API_KEY": vocab.NewSecret(secretCanary)}).Reference
	require.Equal(t, http.StatusCreated, put("op-legacy", legacy).status, "a rip1 reference from an older provider")
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(legacy))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	require.Equal(t, map[string]any{"reference": legacy, "status": "settled"}, w.json(t)["runtimeInputs"], "a rip1 input still settles")
}
