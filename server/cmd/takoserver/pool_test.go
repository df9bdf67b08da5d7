package main_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
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

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// member starts a new node for p's pool, as an operator starts one on a new machine: a new
// sealing key and state directory, the pool's key and the installation's admin token, its edge
// at edge.
func (p *pair) member(t *testing.T, edge string) node {
	t.Helper()
	return startMemberOf(t, p.node, edge)
}

// startMemberOf starts a new node for first's pool: a new sealing key and state directory, the
// pool's key and the installation's admin token (first's), its edge at edge, with the runtime's
// flags extra.
func startMemberOf(t *testing.T, first node, edge string, extra ...string) node {
	t.Helper()
	stateDir := filepath.Join(t.TempDir(), "member")
	require.NoError(t, os.Mkdir(stateDir, 0o700))
	token, err := os.ReadFile(first.tokenFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(stateDir, "admin-token"), token, 0o600))
	return startPooledRuntimeAt(t, stateDir, runtimetest.SealingKeyFile(t), first.poolKeyFile, extra, "127.0.0.1:0", edge)
}

// answers reports whether n's edge answers body at hostname.
func answers(t *testing.T, n node, hostname, body string) func() bool {
	return func() bool {
		code, got := edgeGet(t, n.edgeAddr, hostname)
		return code == http.StatusOK && got == body
	}
}

// secretWorker deploys worker "api" with its runtime input and its endpoint through Host 0, waits
// until the node answers with the secret's length, and returns the endpoint and that answer.
func (p *pair) secretWorker(t *testing.T, tokenPrefix string) (map[string]any, string) {
	t.Helper()
	p.must(0, http.MethodPut, workerPath("api"), tokenPrefix+"-worker-api", p.prepared(), http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("api"), tokenPrefix+"-endpoint-api", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)
	want := strconv.Itoa(len(replicaCanary))
	require.Eventually(t, answers(t, p.node, ep["hostname"].(string), want), 30*time.Second, 200*time.Millisecond, "the worker answers with its secret")
	return ep, want
}

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
	ep, want := p.secretWorker(t, "token-lost-0001")
	p.must(0, http.MethodPut, reservationsPath+"res-old", "token-lost-res-old-000001", `{"space":"prod","workerName":"old"}`, http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("old"), "token-lost-worker-old-001", invariantWorker, http.StatusCreated)
	old := p.must(0, http.MethodPut, endpointPath("old"), "token-lost-endpoint-old-01", `{"worker":"old","originReservationId":"res-old"}`, http.StatusCreated)
	require.Eventually(t, answers(t, p.node, old["hostname"].(string), "ok"), 30*time.Second, 200*time.Millisecond)

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
	_, errOut, err := runRaw(p.dbURL, append(retire, "--last-node", "--fenced-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339))...)
	require.Error(t, err)
	require.Contains(t, errOut, "has not been fenced for the pool's fenceSeconds yet")
	require.Equal(t, true, nodes()[0].(map[string]any)["implicit"], "a refused retire writes nothing")

	fenced := time.Now().Add(-10 * time.Minute).UTC().Truncate(time.Second)
	_, errOut, err = runRaw(p.dbURL, append(retire, "--fenced-since", fenced.Format(time.RFC3339))...)
	require.Error(t, err)
	require.Contains(t, errOut, "the pool's last node is taken out only on purpose (--last-node)")
	run(t, p.dbURL, append(retire, "--fenced-since", fenced.Format(time.RFC3339), "--last-node")...)
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
	// A replica reads the pool again within 5 s of the retire (its cached read still names the
	// lost node, the safe side: a deletion then fails, and is retried).
	require.Eventually(t, func() bool {
		a, err := p.send(0, http.MethodDelete, workerPath("old"), "token-lost-worker-old-001", "")
		return err == nil && a.status == http.StatusOK
	}, 30*time.Second, 500*time.Millisecond)

	// A node in its place, at another admin address and the pool's public edge address.
	p.node = p.member(t, p.node.edgeAddr)
	out := decodeJSON(t, run(t, p.dbURL, "nodes", "add", "node-2", "--url", p.node.adminURL, "--config", p.catalog, "--installation", "selfhost", "--output", "json"))
	require.Equal(t, "joining", out["state"])

	require.Eventually(t, answers(t, p.node, ep["hostname"].(string), want), 60*time.Second, 200*time.Millisecond, "the worker answers on the new node with its secret")
	require.Eventually(t, func() bool {
		for _, n := range nodes() {
			if n := n.(map[string]any); n["name"] == "node-2" {
				return n["state"] == "serving"
			}
		}
		return false
	}, 60*time.Second, 200*time.Millisecond, "the new node serves once caught up")
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

// A pool of three nodes (SPEC 6.2, with real processes). Two nodes join a pool of one that holds
// a worker with a secret: the Hosts' janitors write them the worker, its route and its kept pool
// delivery, and each node's edge answers with the secret; each reads serving once caught up. A
// worker created then runs on all three. One node is killed: once it has been silent for the
// pool's suspectAfter, it leaves the Ready set, a new worker is deployed on the other two and
// reads Ready, but its deletion does not complete while the silent node may still route its
// origin; it completes once that node is retired.
func TestAPoolOfThreeNodesServesEveryWorkerOnEachAndKeepsCustodyWhenOneIsLost(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startPooledRuntime, `"suspectAfterSeconds": 2`, `"fenceSeconds": 1`)
	ep, want := p.secretWorker(t, "token-pool3-001")

	nodeA := p.node
	nodeB, nodeC := p.member(t, "127.0.0.1:0"), p.member(t, "127.0.0.1:0")
	for name, n := range map[string]node{"node-b": nodeB, "node-c": nodeC} {
		run(t, p.dbURL, "nodes", "add", name, "--url", n.adminURL, "--config", p.catalog, "--installation", "selfhost")
	}
	for _, n := range []node{nodeB, nodeC} {
		require.Eventually(t, answers(t, n, ep["hostname"].(string), want), 60*time.Second, 200*time.Millisecond, "a joining node gets the worker and its secret")
	}
	states := func() map[string]string {
		out := map[string]string{}
		for _, n := range decodeJSON(t, run(t, p.dbURL, "nodes", "list", "--config", p.catalog, "--installation", "selfhost", "--output", "json"))["nodes"].([]any) {
			out[n.(map[string]any)["name"].(string)] = n.(map[string]any)["state"].(string)
		}
		return out
	}
	require.Eventually(t, func() bool {
		s := states()
		return s["node-1"] == "serving" && s["node-b"] == "serving" && s["node-c"] == "serving"
	}, 60*time.Second, 200*time.Millisecond)
	health := func(n node) int {
		res, err := http.Get("http://" + n.edgeAddr + "/healthz") // a load balancer's check, by address
		if err != nil {
			return 0
		}
		res.Body.Close()
		return res.StatusCode
	}
	for _, n := range []node{nodeA, nodeB, nodeC} {
		require.Eventually(t, func() bool { return health(n) == http.StatusOK }, 30*time.Second, 200*time.Millisecond,
			"each serving member's health check passes once the Host confirmed it")
	}

	// A worker created now runs on every node.
	p.must(0, http.MethodPut, reservationsPath+"res-one", "token-pool3-res-one-00001", `{"space":"prod","workerName":"one"}`, http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("one"), "token-pool3-worker-one-01", invariantWorker, http.StatusCreated)
	one := p.must(1, http.MethodPut, endpointPath("one"), "token-pool3-endpoint-one1", `{"worker":"one","originReservationId":"res-one"}`, http.StatusCreated)
	for _, n := range []node{nodeA, nodeB, nodeC} {
		require.Eventually(t, answers(t, n, one["hostname"].(string), "ok"), 30*time.Second, 200*time.Millisecond)
	}

	// A node that answers is not lost: retire refuses it and changes nothing.
	retireC := []string{"nodes", "retire", "--lost", "node-c", "--fenced-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"--config", p.catalog, "--installation", "selfhost"}
	_, errOut, err := runRaw(p.dbURL, retireC...)
	require.Error(t, err)
	require.Contains(t, errOut, "it is not lost")
	require.Equal(t, "serving", states()["node-c"])

	// Node C dies. Once it is suspect, a worker is deployed on A and B and reads Ready there.
	require.NoError(t, nodeC.cmd.Process.Signal(syscall.SIGKILL))
	_ = nodeC.cmd.Wait()
	p.must(0, http.MethodPut, reservationsPath+"res-two", "token-pool3-res-two-00001", `{"space":"prod","workerName":"two"}`, http.StatusCreated)
	require.Eventually(t, func() bool {
		a, err := p.send(0, http.MethodPut, workerPath("two"), "token-pool3-worker-two-01", invariantWorker)
		return err == nil && (a.status == http.StatusCreated || a.status == http.StatusOK)
	}, 60*time.Second, 500*time.Millisecond, "a deployment proceeds without the suspect node")
	var two map[string]any
	require.Eventually(t, func() bool {
		a, err := p.send(0, http.MethodPut, endpointPath("two"), "token-pool3-endpoint-two1", `{"worker":"two","originReservationId":"res-two"}`)
		if err != nil || (a.status != http.StatusCreated && a.status != http.StatusOK) {
			return false
		}
		two = decodeJSON(t, a.body)
		return true
	}, 60*time.Second, 500*time.Millisecond)
	for _, n := range []node{nodeA, nodeB} {
		require.Eventually(t, answers(t, n, two["hostname"].(string), "ok"), 30*time.Second, 200*time.Millisecond)
	}
	require.Eventually(t, func() bool {
		return p.must(1, http.MethodGet, workerPath("two"), "", "", http.StatusOK)["ready"] == true
	}, 30*time.Second, 200*time.Millisecond, "Ready on every serving node outside the suspect one")

	// Its deletion waits for node C: suspect, not retired, it may still route the origin.
	a, err := p.send(0, http.MethodDelete, endpointPath("two"), "token-pool3-endpoint-two1", "")
	require.NoError(t, err)
	require.NotEqual(t, http.StatusOK, a.status, "a deletion a member that may route never confirmed: %s", a.body)
	time.Sleep(3 * time.Second) // the janitors' recovery runs meanwhile, and cannot close it either
	var status string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT status::text FROM deletion_attestations WHERE uid = $1`, two["uid"]).Scan(&status))
	require.Equal(t, "open", status)

	run(t, p.dbURL, retireC...)
	require.Eventually(t, func() bool {
		a, err := p.send(1, http.MethodDelete, endpointPath("two"), "token-pool3-endpoint-two1", "")
		return err == nil && a.status == http.StatusOK
	}, 60*time.Second, 500*time.Millisecond, "the deletion completes once the silent node is retired")
	for _, n := range []node{nodeA, nodeB} {
		code, _ := edgeGet(t, n.edgeAddr, two["hostname"].(string))
		require.Equal(t, http.StatusNotFound, code)
		require.True(t, answers(t, n, ep["hostname"].(string), want)(), "the other workers keep answering")
	}

	// The retired node comes back on its disk, at its address: it serves nothing (a member of a
	// pool of three waits for the Host's word, and the Host tells it it was retired).
	admin, err := url.Parse(nodeC.adminURL)
	require.NoError(t, err)
	nodeC = startPooledRuntimeAt(t, nodeC.stateDir, nodeC.sealingKeyFile, nodeC.poolKeyFile, nil, admin.Host, "127.0.0.1:0")
	code, body := edgeGet(t, nodeC.edgeAddr, ep["hostname"].(string))
	require.Equal(t, http.StatusServiceUnavailable, code, "a member back from the dead serves nothing at once: %s", body)
	require.Eventually(t, func() bool {
		_, body := edgeGet(t, nodeC.edgeAddr, ep["hostname"].(string))
		return strings.Contains(body, "retired from pool selfhost")
	}, 30*time.Second, 200*time.Millisecond, "the Host tells it it was retired")
	// It joins again only wiped: added as it is, with the scripts and routes from before, it is
	// refused, and the pool is unchanged.
	_, errOut, err = runRaw(p.dbURL, "nodes", "add", "node-d", "--url", nodeC.adminURL, "--config", p.catalog, "--installation", "selfhost")
	require.Error(t, err)
	require.Contains(t, errOut, "scripts and routes from before: a node joins a pool empty")
	_, ok := states()["node-d"]
	require.False(t, ok, "a refused add writes nothing")

	// Draining node B: its health check fails at once, it serves for the fence (1 s), then not;
	// node A serves throughout.
	run(t, p.dbURL, "nodes", "drain", "node-b", "--config", p.catalog, "--installation", "selfhost")
	require.Equal(t, http.StatusServiceUnavailable, health(nodeB))
	require.Eventually(t, func() bool {
		code, _ := edgeGet(t, nodeB.edgeAddr, ep["hostname"].(string))
		return code == http.StatusServiceUnavailable
	}, 30*time.Second, 100*time.Millisecond, "drained")
	require.True(t, answers(t, nodeA, ep["hostname"].(string), want)())
	require.Equal(t, http.StatusOK, health(nodeA))
	require.Equal(t, "draining", states()["node-b"])

	// Removed: everything taken off it, read back, and it leaves the pool; a deletion then needs
	// node A alone.
	// It refuses until the drain's fence has passed, and while a write still lands on the node
	// (a sweep begun before the drain); the operator runs it again.
	var out map[string]any
	require.Eventually(t, func() bool {
		stdout, _, err := runRaw(p.dbURL, "nodes", "remove", "node-b", "--config", p.catalog, "--installation", "selfhost", "--output", "json")
		if err != nil {
			return false
		}
		out = decodeJSON(t, stdout)
		return true
	}, 60*time.Second, time.Second)
	require.Equal(t, "removed", out["state"])
	bc, err := selfhost.New(nodeB.adminURL, nodeB.tokenFile)
	require.NoError(t, err)
	st, err := bc.Status(context.Background())
	require.NoError(t, err)
	for _, sc := range st.Scripts {
		require.False(t, sc.Present, "script %s is still on the removed node", sc.ScriptName)
	}
	for _, r := range st.Routes {
		require.False(t, r.Present, "route %s is still on the removed node", r.Hostname)
	}
	p.must(0, http.MethodDelete, endpointPath("one"), "token-pool3-endpoint-one1", "", http.StatusOK)
	code, _ = edgeGet(t, nodeA.edgeAddr, one["hostname"].(string))
	require.Equal(t, http.StatusNotFound, code)
	require.NotContains(t, p.logs[0].String()+p.logs[1].String(), replicaCanary)
}

// A database written by the release before pools (SPEC 6.2): its objects on a selfhost offering
// carry the digest that covered runtimeUrl. A Host of this release rewrites them at start, once,
// so the existing single-node catalog is a pool of one with no change: the worker updates in
// place, where a Host reading the old digests answers placement_drift.
func TestADatabaseFromBeforePoolsKeepsItsWorkersPlaced(t *testing.T) {
	t.Parallel()
	p := newPairOn(t, startRuntime)
	p.must(0, http.MethodPut, reservationsPath+"res-api", "token-digest-res-api-0001", `{"space":"prod","workerName":"api"}`, http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("api"), "token-digest-worker-api-01", invariantWorker, http.StatusCreated)
	p.must(0, http.MethodPut, endpointPath("api"), "token-digest-endpoint-api1", `{"worker":"api","originReservationId":"res-api"}`, http.StatusCreated)

	cat, err := catalog.Load(p.catalog)
	require.NoError(t, err)
	ctx := context.Background()
	for _, o := range cat.Offerings {
		require.NotEmpty(t, o.LegacyDigest)
		for _, table := range []string{"worker_endpoint_origin_reservations", "workers", "worker_endpoints", "deployments"} {
			_, err := p.db.Exec(ctx, `UPDATE `+table+` SET offering_digest = $1 WHERE offering_id = $2`, o.LegacyDigest, o.ID)
			require.NoError(t, err)
		}
	}
	update := strings.Replace(invariantWorker, "'ok'", "'again'", 1)
	a, err := p.send(0, http.MethodPut, workerPath("api"), "token-digest-worker-api-01", update)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, a.status, "the old digests are what the release before pools wrote: %s", a.body)
	require.Contains(t, a.body, "placement_drift")

	h, _ := p.start()
	var legacy int
	require.NoError(t, p.db.QueryRow(ctx, `SELECT (SELECT count(*) FROM workers WHERE offering_digest <> ALL ($1))
		+ (SELECT count(*) FROM worker_endpoints WHERE offering_digest <> ALL ($1))
		+ (SELECT count(*) FROM worker_endpoint_origin_reservations WHERE offering_digest <> ALL ($1))
		+ (SELECT count(*) FROM deployments WHERE offering_digest <> ALL ($1))`,
		[]string{cat.Offerings[0].Digest, cat.Offerings[1].Digest}).Scan(&legacy))
	require.Zero(t, legacy, "every row carries its pool's digest")
	p.hosts[0] = h
	p.must(0, http.MethodPut, workerPath("api"), "token-digest-worker-api-01", update, http.StatusOK)
	require.Contains(t, p.logs[len(p.logs)-1].String(), "offering digests moved to their pools'")
}

// HTTPS on a pool with the operator's certificate files (SPEC 6.2): every node is started with the
// same wildcard certificate for the endpoint suffix (issued however the operator likes, DNS-01
// included, and renewed by replacing the files and sending SIGHUP), so each node's edge answers
// every worker over HTTPS with it, whichever node the load balancer picks.
func TestAPoolServesHTTPSOnEveryNodeWithTheOperatorsCertificateFiles(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "pool-edge")
	pair := ca.Server(t, "pool", "*.workers.localhost")
	tlsFlags := []string{"--edge-tls-cert", pair.CertFile, "--edge-tls-key", pair.KeyFile}
	p := newPairOn(t, func(t *testing.T) node {
		dir := filepath.Join(t.TempDir(), "pool")
		require.NoError(t, os.Mkdir(dir, 0o700))
		poolKey := filepath.Join(dir, "pool-key")
		run(t, "", "nodes", "init-pool-key", "--pool", "selfhost", "--out", poolKey)
		return startPooledRuntimeAt(t, filepath.Join(t.TempDir(), "runtime"), runtimetest.SealingKeyFile(t), poolKey, tlsFlags, "127.0.0.1:0", "127.0.0.1:0")
	})
	second := startMemberOf(t, p.node, "127.0.0.1:0", tlsFlags...)
	run(t, p.dbURL, "nodes", "add", "node-2", "--url", second.adminURL, "--config", p.catalog, "--installation", "selfhost")

	p.must(0, http.MethodPut, reservationsPath+"res-tls", "token-pool-tls-res-000001", `{"space":"prod","workerName":"tls"}`, http.StatusCreated)
	p.must(0, http.MethodPut, workerPath("tls"), "token-pool-tls-worker-001", invariantWorker, http.StatusCreated)
	ep := p.must(0, http.MethodPut, endpointPath("tls"), "token-pool-tls-endpoint-1", `{"worker":"tls","originReservationId":"res-tls"}`, http.StatusCreated)
	hostname := ep["hostname"].(string)

	roots := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(pem))
	for name, n := range map[string]node{"node-1": p.node, "node-2": second} {
		client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: roots},
			DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, n.edgeAddr)
			},
			DisableKeepAlives: true,
		}}
		require.Eventually(t, func() bool {
			resp, err := client.Get("https://" + hostname + "/")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode == http.StatusOK && string(b) == "ok"
		}, 60*time.Second, 200*time.Millisecond, "%s answers the worker over HTTPS with the pool's certificate", name)
	}
}

// A pool grown from a node whose workers got their secrets before the pool key was set: the Host
// kept no pool blob of those deliveries, so the new node cannot get them. `nodes add` adds the
// node all the same, and warns, naming how many workers and what brings them back.
func TestAddingANodeWarnsOfSecretsDeliveredBeforeThePoolKey(t *testing.T) {
	t.Parallel()
	p := newPair(t) // no pool key: the delivery goes to the node alone
	p.secretWorker(t, "token-prekey")

	dir := filepath.Join(t.TempDir(), "pool")
	require.NoError(t, os.Mkdir(dir, 0o700))
	poolKey := filepath.Join(dir, "pool-key")
	run(t, "", "nodes", "init-pool-key", "--pool", "selfhost", "--out", poolKey)
	first := p.node
	first.poolKeyFile = poolKey
	added := startMemberOf(t, first, "127.0.0.1:0")
	withKey := node{adminURL: p.admin.url, tokenFile: p.node.tokenFile, edgeAddr: p.node.edgeAddr, poolPublicKey: added.poolPublicKey}.catalog(t)
	out, errOut, err := runRaw(p.dbURL, "nodes", "add", "node-b", "--url", added.adminURL, "--config", withKey, "--installation", "selfhost")
	require.NoError(t, err, "%s%s", out, errOut)
	require.Contains(t, errOut, "warning: 1 live workers of selfhost hold secrets delivered before the pool key was set")
	require.Contains(t, errOut, "bump bindings_wo_version")
	require.Contains(t, out, "node-b")
}
