package main_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

const replicaCanary = "tk-replica-canary-58e1b0"

// call sends one request to a Host and decodes a JSON answer.
func call(t *testing.T, method, url, key, token, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	if token != "" {
		req.Header.Set("Takoform-Ownership-Token", token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil || out == nil {
		// Not a JSON object: what came back is kept for the failure message.
		out = map[string]any{"rawBody": string(raw), "headers": resp.Header}
	}
	return resp.StatusCode, out
}

// TestReplicasShareEverythingThroughTheDatabase: two `takoserver serve` processes with different
// working directories share one database and one runtime node and nothing else. A runtime input
// sealed through one is delivered and settled (by challenge readback) through the other; a worker
// created through one is Ready read through the other; the worker answers at its URL with the
// secret (shown by length and digest only). Neither replica wrote a file, and a dump of the
// database with either replica's directory opens nothing without the key-encryption key.
func TestReplicasShareEverythingThroughTheDatabase(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	run(t, url, "migrate", "up")
	org := decodeJSON(t, run(t, url, "orgs", "create", "acme", "--output", "json"))
	key := decodeJSON(t, run(t, url, "keys", "create", "--org", "acme", "--output", "json"))["key"].(string)
	kek := sealingKey(t)
	rt := startRuntime(t)
	catalog := rt.catalog(t)
	dirs := []string{t.TempDir(), t.TempDir()}
	var hosts []host
	for _, dir := range dirs {
		cmd := exec.Command(binary, "serve", "--listen", "127.0.0.1:0", "--sealing-key-file", kek, "--config", catalog)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "TAKOSERVER_DATABASE_URL="+url)
		logs := &runtimetest.Buffer{}
		cmd.Stdout, cmd.Stderr = logs, logs
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		h := host{url: "http://" + listeningAt(t, logs), logs: logs, cmd: cmd}
		waitReady(t, h.url+"/readyz")
		hosts = append(hosts, h)
	}
	a, b := hosts[0], hosts[1]

	status, res := call(t, http.MethodPut, a.url+"/v1/worker-endpoint-origin-reservations/res-api", key, "token-replica-res-0001",
		`{"space":"prod","workerName":"api"}`)
	require.Equal(t, http.StatusCreated, status, "%v", res)
	nonce := "nonce-replica-1"
	// The rip2 commitment key is the same from either replica: one commitment secret in the
	// database, whichever replica created it. The reference is computed under B's and sealed
	// through A.
	commitment := func(h host) (string, []byte) {
		status, k := call(t, http.MethodPost, h.url+"/v1/runtime-input-commitment-keys", key, "", fmt.Sprintf(`{"materialSetNonce":%q}`, nonce))
		require.Equal(t, http.StatusOK, status, "%v", k)
		raw, err := hex.DecodeString(k["commitmentKey"].(string))
		require.NoError(t, err)
		return k["commitmentSecretId"].(string), raw
	}
	secretID, commitKey := commitment(b)
	otherID, otherKey := commitment(a)
	require.Equal(t, secretID, otherID)
	require.Equal(t, commitKey, otherKey)
	id := runtimeref.DeriveV2(commitKey, secretID, nonce, runtimeref.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api",
		OriginReservationID: "res-api", CanonicalPublicOrigin: res["canonicalOrigin"].(string)}, map[string]string{"API_KEY": replicaCanary})
	prep := fmt.Sprintf(`{"format":"takoserver.worker-runtime-input-preparation@v1","materialSetNonce":%q,"runtimeInputReference":%q,
		"target":{"space":"prod","workerName":"api","bundleName":"main","endpointName":"api","originReservationId":"res-api"},
		"bindings":{"API_KEY":%q}}`, nonce, id.Reference, replicaCanary)
	// Sealed through replica A...
	status, p := call(t, http.MethodPut, a.url+"/v1/organizations/"+org["id"].(string)+"/worker-runtime-input-preparations/op-1", key, "token-replica-prep-001", prep)
	require.Equal(t, http.StatusCreated, status, "%v", p)

	// ...delivered and settled through replica B.
	worker := fmt.Sprintf(`{"modules":{"index.js":%q},"mainModule":"index.js","compatibilityDate":"2025-01-01",
		"requiredSensitiveVars":["API_KEY"],"runtimeInputReference":%q}`, `export default {
  async fetch(request, env) {
    const d = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(env.API_KEY));
    return new Response("len=" + env.API_KEY.length + " sha256=" + [...new Uint8Array(d)].map((b) => b.toString(16).padStart(2, "0")).join(""));
  },
};`, id.Reference)
	status, w := call(t, http.MethodPut, b.url+"/v1/spaces/prod/workers/api", key, "token-replica-worker-1", worker)
	require.Equal(t, http.StatusCreated, status, "%v", w)
	require.Equal(t, map[string]any{"reference": id.Reference, "status": "settled"}, w["runtimeInputs"])

	// A worker created through B is Ready read through A.
	status, got := call(t, http.MethodGet, a.url+"/v1/spaces/prod/workers/api", key, "", "")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, true, got["ready"], "%v", got["conditions"])

	// It answers at its URL with the delivered secret, shown by length and digest only.
	status, e := call(t, http.MethodPut, a.url+"/v1/spaces/prod/worker-endpoints/api", key, "token-replica-endpoint", `{"worker":"api","originReservationId":"res-api"}`)
	require.Equal(t, http.StatusCreated, status, "%v", e)
	req, err := http.NewRequest(http.MethodGet, "http://"+rt.edgeAddr+"/", nil)
	require.NoError(t, err)
	req.Host = e["hostname"].(string)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	answer, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, fmt.Sprintf("len=%d sha256=%x", len(replicaCanary), sha256.Sum256([]byte(replicaCanary))), string(answer))

	// The replicas keep nothing on disk.
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		require.Empty(t, entries, "a Host writes no files: %s", dir)
	}
	// A dump of the database holds the ring only wrapped: with the replicas' directories (empty)
	// and without the key-encryption key, nothing in it is a data key or the value.
	bin, err := pgcluster.BinDir()
	require.NoError(t, err)
	dump, err := exec.Command(filepath.Join(bin, "pg_dump"), "--data-only", "--inserts", url).CombinedOutput()
	require.NoError(t, err, string(dump))
	require.Contains(t, string(dump), "sealing_keys")
	require.NotContains(t, string(dump), replicaCanary)
	kekRaw, err := os.ReadFile(kek)
	require.NoError(t, err)
	require.NotContains(t, string(dump), strings.TrimSpace(string(kekRaw)))
	for _, h := range hosts {
		require.NotContains(t, h.logs.String(), replicaCanary)
	}
}
