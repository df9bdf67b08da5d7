package main_test

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
)

// A runtime node lost for good (SPEC 6.2, with real processes): its machine is gone, so its
// workers' deletions cannot complete and nothing can be destroyed. The operator retires it with
// `nodes retire --lost`, attesting it fenced for the pool's fenceSeconds (refused before), and
// the deletion completes with its attestation closed. A node added in its place at another admin
// address (`nodes add`, with the pool's key and the installation's token) is brought up to date by
// the Hosts' janitors: the live worker answers there with its secret, from the kept pool blob,
// with no tenant action and no runtime input consumed again; the deleted endpoint is never written
// to it; and it reads serving once caught up.
func TestANodeLostForGoodIsRetiredAndReplacedWithNoTenantAction(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startPooledRuntime)
	worker := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-lost-worker-api-001", worker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-lost-endpoint-api-01", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)
	p.must(0, http.MethodPut, reservationsPath+"res-old", "token-lost-res-old-000001", `{"space":"prod","workerName":"old"}`, http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("old"), "token-lost-worker-old-001", invariantWorker, http.StatusCreated)
	old := p.must(0, http.MethodPut, endpointPath("old"), "token-lost-endpoint-old-01", `{"worker":"old","originReservationId":"res-old"}`, http.StatusCreated)
	want := strconv.Itoa(len(replicaCanary))
	answers := func(hostname, body string) func() bool {
		return func() bool {
			code, got := edgeGet(t, p.node.edgeAddr, hostname)
			return code == http.StatusOK && got == body
		}
	}
	require.Eventually(t, answers(ep["hostname"].(string), want), 30*time.Second, 200*time.Millisecond, "the worker answers with its secret")
	require.Eventually(t, answers(old["hostname"].(string), "ok"), 30*time.Second, 200*time.Millisecond)

	// The node's machine is lost. Its endpoint's deletion cannot complete: nobody confirms absence.
	require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.node.cmd.Wait()
	a, err := p.send(0, http.MethodDelete, endpointPath("old"), "token-lost-endpoint-old-01", "")
	require.NoError(t, err)
	require.NotEqual(t, http.StatusOK, a.status, "a deletion no node confirmed: %s", a.body)

	nodes := func() []any {
		return decodeJSON(t, run(t, p.dbURL, "nodes", "list", "--config", p.catalog, "--installation", "selfhost", "--output", "json"))["nodes"].([]any)
	}
	require.Equal(t, true, nodes()[0].(map[string]any)["implicit"], "a pool without rows is the catalog's node")

	// Retire refuses until the node has been fenced for fenceSeconds (300 s by default), and
	// changes nothing then.
	retire := []string{"nodes", "retire", "--config", p.catalog, "--installation", "selfhost", "--lost", "node-1", "--by", "oncall@example.test"}
	_, errOut, err := runRaw(p.dbURL, append(retire, "--fenced-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))...)
	require.Error(t, err)
	require.Contains(t, errOut, "has not been fenced for the pool's fenceSeconds yet")
	require.Equal(t, true, nodes()[0].(map[string]any)["implicit"], "a refused retire writes nothing")

	fenced := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	run(t, p.dbURL, append(retire, "--fenced-since", fenced.Format(time.RFC3339))...)
	got := nodes()
	require.Len(t, got, 1)
	require.Equal(t, "retired", got[0].(map[string]any)["state"])
	var actor, detail string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT actor, detail::text FROM runtime_node_events WHERE action = 'retire'`).Scan(&actor, &detail))
	require.Equal(t, "oncall@example.test", actor, "the operator's attestation is kept")
	require.Contains(t, detail, fenced.Format(time.RFC3339))

	// Its absences count as confirmed now: the deletion completes (the janitor's recovery, or the
	// owner's retry) and its attestation closes.
	require.Eventually(t, func() bool {
		a, err := p.send(1, http.MethodDelete, endpointPath("old"), "token-lost-endpoint-old-01", "")
		return err == nil && a.status == http.StatusOK
	}, 60*time.Second, 500*time.Millisecond, "the endpoint on the retired node is deleted")
	require.Eventually(t, func() bool {
		var status string
		err := p.db.QueryRow(context.Background(), `SELECT status::text FROM deletion_attestations WHERE uid = $1`, old["uid"]).Scan(&status)
		return err == nil && status == "closed"
	}, 30*time.Second, 200*time.Millisecond, "its deletion attestation closes")
	p.must(0, http.MethodDelete, workerPath("old"), "token-lost-worker-old-001", "", http.StatusOK)

	// A node in its place: new machine, new sealing key, the pool's key and the installation's
	// admin token, at another admin address and the pool's public edge address.
	stateDir := filepath.Join(t.TempDir(), "replacement")
	require.NoError(t, os.Mkdir(stateDir, 0o700))
	token, err := os.ReadFile(p.node.tokenFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, "admin-token"), token, 0o600))
	p.node = startPooledRuntimeAt(t, stateDir, runtimetest.SealingKeyFile(t), p.node.poolKeyFile, nil, "127.0.0.1:0", p.node.edgeAddr)
	out := decodeJSON(t, run(t, p.dbURL, "nodes", "add", "node-2", "--url", p.node.adminURL, "--config", p.catalog, "--installation", "selfhost", "--output", "json"))
	require.Equal(t, "joining", out["state"])

	require.Eventually(t, answers(ep["hostname"].(string), want), 60*time.Second, 200*time.Millisecond, "the worker answers on the new node with its secret")
	require.Eventually(t, func() bool {
		for _, n := range nodes() {
			if n := n.(map[string]any); n["name"] == "node-2" {
				return n["state"] == "serving"
			}
		}
		return false
	}, 30*time.Second, 200*time.Millisecond, "the new node serves once caught up")
	code, _ := edgeGet(t, p.node.edgeAddr, old["hostname"].(string))
	require.Equal(t, http.StatusNotFound, code, "the deleted endpoint is never written to the new node")
	require.Eventually(t, func() bool {
		return p.must(1, http.MethodGet, workerPath("api"), "", "", http.StatusOK)["ready"] == true
	}, 30*time.Second, 200*time.Millisecond)
	var status string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT status FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&status))
	require.Equal(t, "settled", status, "no runtime input was consumed again")
	require.NotContains(t, p.logs[0].String()+p.logs[1].String(), replicaCanary)
}
