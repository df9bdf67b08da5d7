package host_test

import (
	"context"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// The reconciler's tests: a node that lost its state, a node holding what a database restored to
// an earlier point no longer knows, and a delete that interleaves with a rewrite. The node is a
// real runtime node whose incarnations run no code (they answer "<script> <incarnation>").

const restored = "wrote an object the runtime node lacked again"

// endpoint creates prod/<worker>'s Host-minted endpoint and answers its hostname.
func (f *fixture) endpoint(worker string) (client.Endpoint, string) {
	f.t.Helper()
	e, _, err := f.api.PutEndpoint(context.Background(), "prod", worker, "token-endpoint-"+worker+"-000001", 0, client.EndpointSpec{Worker: worker})
	require.NoError(f.t, err)
	return e, e.Hostname
}

// admin is a client of the node's admin API, as an operator (or another Host) would use it.
func (f *fixture) admin() *selfhost.Client {
	f.t.Helper()
	c, err := selfhost.New(f.node.Info.AdminURL, f.node.Info.TokenFile)
	require.NoError(f.t, err)
	return c
}

// serves is the edge's answer for hostname: its status and body.
func (f *fixture) serves(hostname string) (int, string) {
	f.t.Helper()
	code, body, _, err := f.node.TryGet(hostname, "/")
	require.NoError(f.t, err)
	return code, body
}

func (f *fixture) ready(name string) bool {
	f.t.Helper()
	w, err := f.api.GetWorker(context.Background(), "prod", name)
	require.NoError(f.t, err)
	return w.Ready
}

// A node that lost its whole state directory gets its workers' scripts and routes back from the
// janitor, with no tenant action; until then the Host reads the worker as not Ready. A second
// sweep finds nothing to do.
func TestTheReconcileStepPutsAnEmptiedNodeBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	w := f.worker("api")
	_, host := f.endpoint("api")
	code, body := f.serves(host)
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, w.ScriptName), body)
	require.Zero(t, f.sweep(restored), "a node that holds what the ledger says is left alone")

	f.node.RestartInPlace(t, func() { require.NoError(t, os.RemoveAll(f.node.StateDir)) })
	code, _ = f.serves(host)
	require.Equal(t, http.StatusNotFound, code, "the emptied node routes nothing")
	require.False(t, f.ready("api"), "the Host reads the worker as it is: not Ready")

	require.Equal(t, 2, f.sweep(restored), "the script and the route are written again")
	require.Eventually(t, func() bool { return f.ready("api") }, 10*time.Second, 50*time.Millisecond)
	code, body = f.serves(host)
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, w.ScriptName), body)
	require.Zero(t, f.sweep(restored))

	require.Equal(t, "2", f.text(`SELECT count(*)::text FROM node_reconciliations WHERE action = 'restored' AND installation = 'selfhost'`))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_node_reconciled_total", map[string]string{"installation": "selfhost", "kind": "worker", "action": "restored"}))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_node_reconciled_total", map[string]string{"installation": "selfhost", "kind": "endpoint", "action": "restored"}))
}

// After the database is restored to an earlier point, a node holds what the ledger no longer
// knows: here a newer deployment of a worker the restored ledger has at an older one, another
// organization's worker serving a hostname the ledger gives back to its former owner, and a
// deleted worker's script an old node backup brought back. The janitor takes each down (fenced,
// removed), warns and records it, and writes back what the ledger says: the hostname serves its
// owner again, never the other organization. The node's generations had moved far past the
// restored database's; the worker's next update deploys all the same.
func TestTheReconcileStepFencesWhatARestoredLedgerDoesNotKnow(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	w := f.worker("api")
	_, host := f.endpoint("api")
	old := f.worker("old")
	oldDeployment := f.text(`SELECT id::text FROM deployments WHERE resource_uid = $1`, old.UID)
	_, err := f.api.DeleteWorker(ctx, "prod", "old", "token-worker-old-0000000001")
	require.NoError(t, err)

	node := f.admin()
	put := func(script, workerUID, deployment, org string, generation int64, source string) {
		t.Helper()
		_, err := node.PutScript(ctx, script, adminapi.ScriptPut{EffectID: uuid.NewString(), WorkerUID: workerUID, DeploymentID: deployment,
			Generation: generation, Labels: adminapi.Labels{Organization: org, Space: "prod", Worker: "x"},
			Modules: map[string]string{"index.js": source}, MainModule: "index.js", CompatibilityDate: "2025-01-01", SecretNames: []string{}})
		require.NoError(t, err)
	}
	// The update the restored ledger lost, far ahead of its generations.
	put(w.ScriptName, w.UID, uuid.NewString(), "acme", 1_000_000, "export default { fetch() { return new Response('lost update') } }")
	// Another organization's worker on acme's hostname.
	intruder, intruderEndpoint := "intruder-prod-0123456789abcdef0123456789abcdef", uuid.NewString()
	put(intruder, uuid.NewString(), uuid.NewString(), "globex", 1_000_001, "export default { fetch() { return new Response('globex') } }")
	_, err = node.DeleteRoute(ctx, host, w.ScriptName, f.text(`SELECT uid::text FROM worker_endpoints WHERE hostname = $1`, host))
	require.NoError(t, err)
	_, err = node.PutRoute(ctx, host, adminapi.RoutePut{EffectID: uuid.NewString(), ScriptName: intruder, EndpointUID: intruderEndpoint, DeploymentID: uuid.NewString()})
	require.NoError(t, err)
	// The deleted worker's script, from an old backup of the node.
	put(old.ScriptName, old.UID, oldDeployment, "acme", 1_000_002, "export default { fetch() { return new Response('old') } }")
	_, body := f.serves(host)
	require.True(t, strings.HasPrefix(body, intruder), "the setup: globex serves acme's hostname (%s)", body)

	f.host.Sweep(ctx)
	warned := map[string]int{}
	for _, l := range logged(t, f.logs, "WARN") {
		warned[l["action"].(string)+" "+l["kind"].(string)]++
		if l["action"] == "fenced" && l["kind"] == "endpoint" {
			require.Equal(t, host, l["name"])
		}
	}
	require.Equal(t, map[string]int{"fenced worker": 2, "fenced endpoint": 1, "removed worker": 1}, warned)

	code, body := f.serves(host)
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, w.ScriptName), "the hostname serves its owner again, not %q", body)
	status, err := node.Status(ctx)
	require.NoError(t, err)
	var scripts []string
	for _, s := range status.Scripts {
		scripts = append(scripts, s.ScriptName)
	}
	require.Equal(t, []string{w.ScriptName}, scripts, "nothing the ledger does not hold is left")
	require.Equal(t, f.text(`SELECT id::text FROM deployments WHERE resource_uid = $1 AND status = 'active'`, w.UID), status.Scripts[0].DeploymentID)
	require.Greater(t, status.Scripts[0].Generation, int64(1_000_002), "the ledger's deployment was written past the node's generations")

	require.Equal(t, "globex", f.text(`SELECT organization FROM node_reconciliations WHERE action = 'fenced' AND native_name = $1`, intruder))
	require.Equal(t, "1", f.text(`SELECT count(*)::text FROM node_reconciliations WHERE action = 'removed' AND resource_uid = $1`, old.UID))
	require.Equal(t, 1.0, metric(t, f.host, "takoserver_node_reconciled_total", map[string]string{"installation": "selfhost", "kind": "endpoint", "action": "fenced"}))

	// The next update deploys: the generations it gets are past everything the node has seen.
	_, _, err = f.api.PutWorker(ctx, "prod", "api", "token-worker-api-0000000001", 0, client.WorkerSpec{
		Modules: map[string]string{"index.js": "export default { fetch() { return new Response('v2') } }"}, MainModule: "index.js",
		CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}})
	require.NoError(t, err)
	require.True(t, f.ready("api"))
}

// A delete that locks the worker first, while the janitor is about to write its script again,
// wins: the janitor waits for the row, finds the worker no longer live, and writes nothing, so it
// never brings back a script whose delete is under way.
func TestTheReconcileStepNeverWritesBackAWorkerBeingDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	w := f.worker("api")
	_, err := f.admin().DeleteScript(ctx, w.ScriptName, w.UID)
	require.NoError(t, err)

	// The delete's plan transaction, as DeleteWorker runs it: the worker's row, then its status and
	// its deployment's.
	tx, err := f.db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT 1 FROM workers WHERE uid = $1 FOR UPDATE`, w.UID)
	require.NoError(t, err)
	swept := make(chan struct{})
	go func() { f.host.Sweep(ctx); close(swept) }()
	// Known by the statement's name: pg_stat_activity keeps only the first 1 KiB of its text.
	require.Eventually(t, func() bool {
		return f.text(`SELECT count(*)::text FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%name: ReconcileLockWorker %'`) == "1"
	}, 10*time.Second, 10*time.Millisecond, "the janitor waits for the worker's row")
	_, err = tx.Exec(ctx, `UPDATE workers SET status = 'deleting' WHERE uid = $1`, w.UID)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `UPDATE deployments SET status = 'deleting' WHERE resource_uid = $1`, w.UID)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	<-swept

	st, err := f.admin().GetScript(ctx, w.ScriptName)
	require.NoError(t, err)
	require.False(t, st.Present, "the janitor wrote back a worker being deleted")
	require.Equal(t, "0", f.text(`SELECT count(*)::text FROM node_reconciliations`))
}
