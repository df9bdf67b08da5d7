package main_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
)

// edgeGet asks the node's edge at edgeAddr for / at hostname: its status and body, or 0 and the
// error's text when nothing answered.
func edgeGet(t *testing.T, edgeAddr, hostname string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/", nil)
	require.NoError(t, err)
	req.Host = hostname
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Issue 34 item 2, with real processes: a runtime node killed and started again on an empty state
// directory, at the same addresses, gets its workers' scripts and routes back from the Hosts'
// janitors within seconds, with no tenant action: the endpoint's URL answers again and the worker
// reads Ready.
func TestANodeThatLostItsStateGetsItsWorkersBackFromTheHost(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	p.must(0, http.MethodPut, workerPath("api"), "token-lost-worker-000001", invariantWorker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-lost-endpoint-00001", `{"worker":"api"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)
	get := func() (int, string) { return edgeGet(t, p.node.edgeAddr, hostname) }
	code, body := get()
	require.Equal(t, http.StatusOK, code, body)

	p.loseNodeState(t)

	require.Eventually(t, func() bool {
		code, body := get()
		return code == http.StatusOK && body == "ok"
	}, 60*time.Second, 200*time.Millisecond, "the endpoint's URL answers again")
	require.Eventually(t, func() bool {
		return p.must(1, http.MethodGet, workerPath("api"), "", "", http.StatusOK)["ready"] == true
	}, 30*time.Second, 200*time.Millisecond)
	logs := p.logs[0].String() + p.logs[1].String()
	require.Contains(t, logs, "wrote an object the runtime node lacked again")
	var restored int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM node_reconciliations WHERE action = 'restored'`).Scan(&restored))
	require.GreaterOrEqual(t, restored, 2, "the script and the route, each recorded (two janitors may both write one)")
	require.False(t, strings.Contains(logs, `"action":"fenced"`), "nothing is fenced")
}

// A worker whose last update failed (its code does not start) keeps serving its earlier
// deployment, and a node that lost its state gets that deployment back from the Host: the Host
// keeps the bundle of the active deployment while the worker's row names a newer generation, so
// every node (a new member of a pool too) runs what the others run.
func TestANodeThatLostItsStateGetsBackTheDeploymentOfAWorkerWhoseLastUpdateFailed(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	p.must(0, http.MethodPut, workerPath("api"), "token-failed-worker-00001", invariantWorker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-failed-endpoint-0001", `{"worker":"api"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)
	broken := strings.Replace(invariantWorker, "export default { async fetch() { return new Response('ok') } }", "export default { fetch( {", 1)
	require.NotEqual(t, invariantWorker, broken)
	p.must(0, http.MethodPut, workerPath("api"), "token-failed-worker-00001", broken, http.StatusUnprocessableEntity)
	code, body := edgeGet(t, p.node.edgeAddr, hostname)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "ok", body, "the earlier deployment keeps serving")

	p.loseNodeState(t)
	require.Eventually(t, func() bool {
		code, body := edgeGet(t, p.node.edgeAddr, hostname)
		return code == http.StatusOK && body == "ok"
	}, 60*time.Second, 200*time.Millisecond, "the node gets the active deployment back, not the failed one nor nothing")

	var kept int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM worker_kept_bundles`).Scan(&kept))
	require.Equal(t, 1, kept)
	// Once a fixed update is active, the kept bundle goes.
	fixed := strings.Replace(invariantWorker, "return new Response('ok') }", "return new Response('ok') } /* fixed */", 1)
	require.NotEqual(t, invariantWorker, fixed)
	p.must(1, http.MethodPut, workerPath("api"), "token-failed-worker-00001", fixed, http.StatusOK)
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM worker_kept_bundles`).Scan(&kept))
	require.Zero(t, kept)
}

// loseNodeState kills p's node, deletes its state directory and starts an empty node (the same
// sealing key) at the same addresses: a machine whose disk was lost, replaced in place.
func (p *pair) loseNodeState(t *testing.T) {
	t.Helper()
	require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.node.cmd.Wait()
	require.NoError(t, os.RemoveAll(p.node.stateDir))
	admin, err := url.Parse(p.node.adminURL)
	require.NoError(t, err)
	p.node = startRuntimeAt(t, p.node.stateDir, p.node.sealingKeyFile, admin.Host, p.node.edgeAddr)
}

// SPEC 6.2, secrets in a pool, with real processes: a worker's secret is delivered sealed to the
// pool's key, and the Host keeps only that blob. Its node is killed, its state directory destroyed,
// and a node with a new sealing key of its own but the pool's key starts at the same addresses:
// the Hosts' janitors write the script and route again and name the delivery's blob to it, the
// node opens it, and the endpoint answers with the secret again, with no tenant action and no
// runtime input consumed again. The blob never shows the value, and neither does any log.
func TestAPoolNodeThatLostItsStateGetsItsSecretsBackWithNoTenantAction(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startPooledRuntime)
	worker := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-pool-worker-000001", worker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-pool-endpoint-00001", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)
	get := func() (int, string) { return edgeGet(t, p.node.edgeAddr, hostname) }
	want := strconv.Itoa(len(replicaCanary))
	require.Eventually(t, func() bool {
		code, body := get()
		return code == http.StatusOK && body == want
	}, 30*time.Second, 200*time.Millisecond, "the worker answers with its secret")
	var blob []byte
	var status string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT status, pool_blob FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&status, &blob))
	require.Equal(t, "settled", status)
	require.NotEmpty(t, blob, "the dispatch kept the delivery sealed to the pool")
	require.NotContains(t, string(blob), replicaCanary)

	require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.node.cmd.Wait()
	require.NoError(t, os.RemoveAll(p.node.stateDir))
	admin, err := url.Parse(p.node.adminURL)
	require.NoError(t, err)
	p.node = startPooledRuntimeAt(t, p.node.stateDir, runtimetest.SealingKeyFile(t), p.node.poolKeyFile, nil, admin.Host, p.node.edgeAddr)

	require.Eventually(t, func() bool {
		code, body := get()
		return code == http.StatusOK && body == want
	}, 60*time.Second, 200*time.Millisecond, "the endpoint answers with the secret again")
	require.Eventually(t, func() bool {
		return p.must(1, http.MethodGet, workerPath("api"), "", "", http.StatusOK)["ready"] == true
	}, 30*time.Second, 200*time.Millisecond)
	var restored int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM node_reconciliations WHERE action = 'restored' AND detail LIKE '%secret delivery%'`).Scan(&restored))
	require.GreaterOrEqual(t, restored, 1, "the delivery named again is recorded")
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT status FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&status))
	require.Equal(t, "settled", status, "no runtime input was consumed again")
	logs := p.logs[0].String() + p.logs[1].String()
	require.NotContains(t, logs, replicaCanary)

	// An update that drops the worker's secrets: its blob is never named again, and the janitor
	// drops it.
	p.must(0, http.MethodPut, workerPath("api"), "token-pool-worker-000001", invariantWorker, http.StatusOK)
	require.Eventually(t, func() bool {
		var held bool
		require.NoError(t, p.db.QueryRow(context.Background(), `SELECT pool_blob IS NOT NULL FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&held))
		return !held
	}, 30*time.Second, 200*time.Millisecond, "the blob of a runtime input the worker no longer consumes is dropped")
}

// A pool key rotated (SPEC 6.2) with real processes: the node restarted with the new key and the
// one it replaces, `nodes rotate-pool-key` has it seal the kept blob again to the new key (the Host
// never opens it), and a node holding only the new key, started on an empty state directory, gets
// the worker's secret back from that blob.
func TestAPoolKeyRotatesThroughTheNodeWithNoTenantAction(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startPooledRuntime)
	worker := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-rotate-worker-00001", worker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-rotate-endpoint-0001", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)
	want := strconv.Itoa(len(replicaCanary))
	answers := func() bool {
		code, body := edgeGet(t, p.node.edgeAddr, hostname)
		return code == http.StatusOK && body == want
	}
	require.Eventually(t, answers, 30*time.Second, 200*time.Millisecond)
	blob := func() []byte {
		var b []byte
		require.NoError(t, p.db.QueryRow(context.Background(), `SELECT pool_blob FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&b))
		return b
	}
	before := blob()

	dir := filepath.Join(t.TempDir(), "pool-new")
	require.NoError(t, os.Mkdir(dir, 0o700))
	newKey := filepath.Join(dir, "pool-key")
	newPublic := decodeJSON(t, run(t, "", "nodes", "init-pool-key", "--pool", "selfhost", "--out", newKey, "--output", "json"))["poolPublicKey"].(string)
	cat := node{adminURL: p.node.adminURL, tokenFile: p.node.tokenFile, edgeAddr: p.node.edgeAddr, poolPublicKey: newPublic}.catalog(t)
	restart := func(wipe bool, poolKey string, extra ...string) {
		require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGKILL))
		_ = p.node.cmd.Wait()
		if wipe {
			require.NoError(t, os.RemoveAll(p.node.stateDir))
		}
		admin, err := url.Parse(p.node.adminURL)
		require.NoError(t, err)
		p.node = startPooledRuntimeAt(t, p.node.stateDir, p.node.sealingKeyFile, poolKey, extra, admin.Host, p.node.edgeAddr)
	}
	_, errOut, err := runRaw(p.dbURL, "nodes", "rotate-pool-key", "--config", cat, "--installation", "selfhost")
	require.Error(t, err, "refused while the node does not hold the new key")
	require.Contains(t, errOut, "restart it with --pool-key-file NEW --previous-pool-key-file OLD first")

	oldKey := p.node.poolKeyFile
	restart(false, newKey, "--previous-pool-key-file", oldKey)
	require.Eventually(t, answers, 30*time.Second, 200*time.Millisecond)
	out := decodeJSON(t, run(t, p.dbURL, "nodes", "rotate-pool-key", "--config", cat, "--installation", "selfhost", "--output", "json"))
	require.EqualValues(t, 1, out["resealed"])
	after := blob()
	require.NotEqual(t, before, after, "the blob is sealed again")
	require.NotContains(t, string(after), replicaCanary)

	restart(true, newKey)
	require.Eventually(t, answers, 60*time.Second, 200*time.Millisecond, "a node holding only the new key gets the secret back")
}

// A node put back from a backup taken before the worker's secret was rotated (SPEC 6.2, with real
// processes) serves the superseded delivery it held then; the Hosts' janitors name the newest one
// again in its place (a restore over exactly that delivery), and the endpoint answers with the
// new secret, with no tenant action.
func TestANodeBackFromAnOldBackupGetsTheNewestDeliveryInPlaceOfTheOneItHeld(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startPooledRuntime)
	first := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-backup-worker-00001", first, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), "token-backup-endpoint-0001", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)
	answer := func() string {
		_, body := edgeGet(t, p.node.edgeAddr, hostname)
		return body
	}
	require.Eventually(t, func() bool { return answer() == strconv.Itoa(len(replicaCanary)) }, 30*time.Second, 200*time.Millisecond)
	backup := filepath.Join(t.TempDir(), "node.backup")
	run(t, "", "runtime", "backup", "--out", backup, "--admin-url", p.node.adminURL, "--token-file", p.node.tokenFile)

	// The secret rotated: a second runtime input, longer.
	const rotated = replicaCanary + "-rotated"
	res := p.must(0, http.MethodGet, reservationsPath+"res-api", "", "", http.StatusOK)
	id := runtimeref.Derive("nonce-backup-2", runtimeref.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api",
		OriginReservationID: "res-api", CanonicalPublicOrigin: res["canonicalOrigin"].(string)}, map[string]string{"API_KEY": rotated})
	p.must(0, http.MethodPut, "/v1/organizations/"+p.orgID+"/worker-runtime-input-preparations/op-2", "token-backup-prep-000002",
		fmt.Sprintf(`{"format":"takoserver.worker-runtime-input-preparation@v1","materialSetNonce":"nonce-backup-2","runtimeInputReference":%q,
		"target":{"space":"prod","workerName":"api","bundleName":"main","endpointName":"api","originReservationId":"res-api"},
		"bindings":{"API_KEY":%q}}`, id.Reference, rotated), http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("api"), "token-backup-worker-00001", fmt.Sprintf(secretWorker, id.Reference), http.StatusOK)
	require.Eventually(t, func() bool { return answer() == strconv.Itoa(len(rotated)) }, 30*time.Second, 200*time.Millisecond)

	require.NoError(t, p.node.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.node.cmd.Wait()
	run(t, "", "runtime", "restore", "--from", backup, "--state-dir", p.node.stateDir, "--replace")
	admin, err := url.Parse(p.node.adminURL)
	require.NoError(t, err)
	p.node = startPooledRuntimeAt(t, p.node.stateDir, p.node.sealingKeyFile, p.node.poolKeyFile, nil, admin.Host, p.node.edgeAddr)
	require.Eventually(t, func() bool { return answer() == strconv.Itoa(len(rotated)) }, 60*time.Second, 200*time.Millisecond,
		"the newest delivery is named again in place of the superseded one the backup held")
	var restored int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM node_reconciliations WHERE detail LIKE '%which it superseded%'`).Scan(&restored))
	require.GreaterOrEqual(t, restored, 1)
	require.NotContains(t, p.logs[0].String()+p.logs[1].String(), rotated)
}
