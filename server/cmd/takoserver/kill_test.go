package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// Real `takoserver serve` processes stopped (SIGKILL) or racing at the points the in-process tests
// of package server can only simulate with a hook: mid-dispatch, between an endpoint's create and
// its activation, and two Hosts consuming one runtime input at once.

// pair is two Host processes on one database and one runtime node, reached through a proxy in
// front of the node's admin API that can hold one request.
type pair struct {
	t       *testing.T
	dbURL   string
	db      *pgxpool.Pool
	kek     string
	catalog string
	orgID   string
	key     string
	admin   *heldAdmin
	node    node
	hosts   [2]host
	procs   [2]*exec.Cmd
	logs    []*runtimetest.Buffer
}

func newPair(t *testing.T) *pair {
	t.Helper()
	return newPairOn(t, startRuntime)
}

// newPairOn is newPair on the runtime node start starts.
func newPairOn(t *testing.T, start func(*testing.T) node, installationFields ...string) *pair {
	t.Helper()
	p := &pair{t: t, dbURL: testdb.URL(t)}
	run(t, p.dbURL, "migrate", "up")
	db, err := store.Open(context.Background(), p.dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	p.db = db
	p.orgID = decodeJSON(t, run(t, p.dbURL, "orgs", "create", "acme", "--output", "json"))["id"].(string)
	p.key = decodeJSON(t, run(t, p.dbURL, "keys", "create", "--org", "acme", "--output", "json"))["key"].(string)
	p.kek = sealingKey(t)
	p.node = start(t)
	p.admin = holdAdmin(t, p.node.adminURL)
	p.catalog = node{adminURL: p.admin.url, tokenFile: p.node.tokenFile, edgeAddr: p.node.edgeAddr, poolPublicKey: p.node.poolPublicKey}.catalog(t, installationFields...)
	for i := range p.hosts {
		p.hosts[i], p.procs[i] = p.start()
	}
	return p
}

// start runs one Host whose janitor sweeps every second.
func (p *pair) start() (host, *exec.Cmd) {
	p.t.Helper()
	h := startHost(p.t, p.dbURL, p.kek, "--config", p.catalog, "--janitor-every", "1s")
	p.logs = append(p.logs, h.logs)
	p.t.Cleanup(func() {
		if p.t.Failed() {
			p.t.Logf("Host log:\n%s", h.logs.String())
		}
	})
	return h, h.cmd
}

// kill stops Host i with SIGKILL: no deferred step, no graceful shutdown.
func (p *pair) kill(i int) {
	p.t.Helper()
	require.NoError(p.t, p.procs[i].Process.Signal(syscall.SIGKILL))
	_ = p.procs[i].Wait()
}

// advance moves the database's clock, for every Host at once.
func (p *pair) advance(interval string) {
	p.t.Helper()
	_, err := p.db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES ($1::interval)
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`, interval)
	require.NoError(p.t, err)
}

// send is one request to Host i, with headers (name, value, …) beside the key and the token; it
// never fails the test, so it may run on any goroutine.
func (p *pair) send(i int, method, path, token, body string, headers ...string) (answer, error) {
	req, err := http.NewRequest(method, p.hosts[i].url+path, stringsReader(body))
	if err != nil {
		return answer{}, err
	}
	for h := 0; h+1 < len(headers); h += 2 {
		req.Header.Set(headers[h], headers[h+1])
	}
	req.Header.Set("Authorization", "Bearer "+p.key)
	if token != "" {
		req.Header.Set("Takoform-Ownership-Token", token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	var b []byte
	buf := make([]byte, 32<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		b = append(b, buf[:n]...)
		if rerr != nil {
			break
		}
	}
	return answer{status: resp.StatusCode, replayed: resp.Header.Get("Takoform-Replayed"), body: string(b)}, nil
}

func (p *pair) must(i int, method, path, token, body string, statuses ...int) map[string]any {
	p.t.Helper()
	a, err := p.send(i, method, path, token, body)
	require.NoError(p.t, err)
	require.Contains(p.t, statuses, a.status, "%s %s: %s", method, path, a.body)
	var out map[string]any
	_ = json.Unmarshal([]byte(a.body), &out)
	return out
}

func (p *pair) preparationStatus(op string) string {
	p.t.Helper()
	var s string
	require.NoError(p.t, p.db.QueryRow(context.Background(), `SELECT status FROM runtime_input_preparations WHERE operation_id = $1`, op).Scan(&s))
	return s
}

// prepared reserves res-api for prod/api and prepares op-1 for it through Host 0; it answers the
// worker body that consumes it.
func (p *pair) prepared() string {
	p.t.Helper()
	res := p.must(0, http.MethodPut, reservationsPath+"res-api", "token-kill-res-00000001", `{"space":"prod","workerName":"api"}`, http.StatusCreated)
	id := runtimeref.Derive("nonce-kill-1", runtimeref.Target{Space: "prod", WorkerName: "api", BundleName: "main", EndpointName: "api",
		OriginReservationID: "res-api", CanonicalPublicOrigin: res["canonicalOrigin"].(string)}, map[string]string{"API_KEY": replicaCanary})
	p.must(0, http.MethodPut, "/v1/organizations/"+p.orgID+"/worker-runtime-input-preparations/op-1", "token-kill-prep-0000001",
		fmt.Sprintf(`{"format":"takoserver.worker-runtime-input-preparation@v1","materialSetNonce":"nonce-kill-1","runtimeInputReference":%q,
		"target":{"space":"prod","workerName":"api","bundleName":"main","endpointName":"api","originReservationId":"res-api"},
		"bindings":{"API_KEY":%q}}`, id.Reference, replicaCanary), http.StatusCreated)
	return fmt.Sprintf(secretWorker, id.Reference)
}

// waitHeld waits until the armed proxy holds its request, failing if the request ended first.
func (p *pair) waitHeld(held <-chan struct{}, done <-chan answer, what string) {
	p.t.Helper()
	select {
	case <-held:
	case a := <-done:
		p.t.Fatalf("%s ended before it was held: %d %s", what, a.status, a.body)
	case <-time.After(90 * time.Second):
		p.t.Fatalf("%s was never held", what)
	}
}

// TestAHostKilledMidDispatchNeverDeliversTwice: a Host process delivering a runtime input to an
// existing worker (an update that consumes it) is killed (SIGKILL) while its delivery is held at
// the runtime node's admin API, after the dispatch compare-and-swap committed; the delivery then
// lands. The other Host's janitor settles the lease by readback once the dead Host's lease
// expires, the owner's retry through that Host answers the settled worker, and the runtime node
// received exactly one delivery.
func TestAHostKilledMidDispatchNeverDeliversTwice(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	worker := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-kill-worker-00001", invariantWorker, http.StatusCreated)

	held := p.admin.arm()
	done := make(chan answer, 1)
	go func() {
		a, _ := p.send(0, http.MethodPut, workerPath("api"), "token-kill-worker-00001", worker)
		done <- a
	}()
	p.waitHeld(held, done, "the delivery")
	require.Equal(t, "dispatched", p.preparationStatus("op-1"), "the dispatch committed before the backend call")
	p.kill(0)
	<-done
	p.admin.release(true)
	// The delivery lands: the runtime node holds it before recovery looks. (Recovery that reads
	// back while the runtime is still applying it finds nothing and fails the lease: the values
	// then land all the same, once, and the owner must bump bindings_wo_version.)
	c, err := selfhost.New(p.node.adminURL, p.node.tokenFile)
	require.NoError(t, err)
	var script string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT script_name FROM workers WHERE name = 'api'`).Scan(&script))
	require.Eventually(t, func() bool {
		st, err := c.GetScript(context.Background(), script)
		return err == nil && st.Secrets.Delivered
	}, 60*time.Second, 50*time.Millisecond, "the held delivery never landed")

	p.advance("2 minutes") // the killed Host's lease runs out by database time
	deadline := time.Now().Add(60 * time.Second)
	for p.preparationStatus("op-1") == "dispatched" && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	var failure *string
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT failure FROM runtime_input_preparations WHERE operation_id = 'op-1'`).Scan(&failure))
	require.Equal(t, "settled", p.preparationStatus("op-1"), "recovery by the other Host settles by readback (failure: %v)", failure)

	got := p.must(1, http.MethodPut, workerPath("api"), "token-kill-worker-00001", worker, http.StatusCreated, http.StatusOK)
	require.Equal(t, "settled", got["runtimeInputs"].(map[string]any)["status"], "%v", got)
	require.Equal(t, true, got["ready"], "%v", got)
	require.EqualValues(t, 1, p.admin.deliveries.Load(), "the values went to the runtime once")
}

// TestTwoHostProcessesConsumingOneRuntimeInputDeliverItOnce: the same consumption (a client
// retrying on another replica) reaches two Host processes while the first one's delivery is held
// at the runtime node: the second is told the intent is in progress and delivers nothing; once
// the delivery lands the second answers the first's stored response. One delivery in all.
func TestTwoHostProcessesConsumingOneRuntimeInputDeliverItOnce(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	worker := p.prepared()

	held := p.admin.arm()
	done := make(chan answer, 1)
	go func() {
		a, _ := p.send(0, http.MethodPut, workerPath("api"), "token-race-worker-00001", worker)
		done <- a
	}()
	p.waitHeld(held, done, "the first Host's delivery")
	second, err := p.send(1, http.MethodPut, workerPath("api"), "token-race-worker-00001", worker)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, second.status, second.body)
	require.Contains(t, second.body, `"code":"intent_in_progress"`)
	require.EqualValues(t, 0, p.admin.deliveries.Load(), "the second Host delivered nothing")

	p.admin.release(true)
	first := <-done
	require.Equal(t, http.StatusCreated, first.status, first.body)
	again, err := p.send(1, http.MethodPut, workerPath("api"), "token-race-worker-00001", worker)
	require.NoError(t, err)
	require.Equal(t, first.body, again.body, "the second Host answers the stored response")
	require.Equal(t, "true", again.replayed)
	require.Equal(t, "settled", p.preparationStatus("op-1"))
	require.EqualValues(t, 1, p.admin.deliveries.Load(), "one delivery in all")
}

// TestAHostKilledBetweenEndpointCreateAndActivationLeavesTheWitness: a Host process is killed
// (SIGKILL) while its endpoint create is held at the runtime node's route write, after the create's
// first transaction and before any activation; the route then lands. Through the other Host the
// reservation holds the endpoint as its witness: its release is fenced and another organization
// cannot take the origin. The owner's retry through the other Host completes the endpoint, which
// activates; two days later (past the TTL) the origin is still held.
func TestAHostKilledBetweenEndpointCreateAndActivationLeavesTheWitness(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	shop := `{"space":"prod","workerName":"api","subdomain":"shop","ttlSeconds":3600}`
	p.must(0, http.MethodPut, reservationsPath+"res-api", "token-kill-res-00000001", shop, http.StatusCreated)
	w := p.must(0, http.MethodPut, workerPath("api"), "token-kill-worker-00001", invariantWorker, http.StatusCreated)

	held := p.admin.armFor(isRoutePut)
	done := make(chan answer, 1)
	endpoint := `{"worker":"api","originReservationId":"res-api"}`
	go func() {
		a, _ := p.send(0, http.MethodPut, endpointPath("api"), "token-kill-endpoint-001", endpoint)
		done <- a
	}()
	p.waitHeld(held, done, "the endpoint's route write")
	p.kill(0)
	<-done
	p.admin.release(true)

	res := p.must(1, http.MethodGet, reservationsPath+"res-api", "", "", http.StatusOK)
	require.NotNil(t, res["endpoint"], "the witness was written before the route: %v", res)
	require.Equal(t, w["uid"], res["boundWorker"].(map[string]any)["uid"])
	fenced := p.must(1, http.MethodDelete, reservationsPath+"res-api", "token-kill-res-00000001", "", http.StatusConflict)
	require.Equal(t, "release_fenced", fenced["code"])
	require.Contains(t, fenced["unmetFences"], "endpoint_present")

	decodeJSON(t, run(t, p.dbURL, "orgs", "create", "globex", "--output", "json"))
	otherKey := decodeJSON(t, run(t, p.dbURL, "keys", "create", "--org", "globex", "--output", "json"))["key"].(string)
	steal := func() {
		t.Helper()
		a, err := putWith(http.DefaultClient, p.hosts[1].url+reservationsPath+"res-steal", otherKey, "token-steal-0000000001", shop)
		require.NoError(t, err)
		require.Equal(t, http.StatusConflict, a.status, a.body)
		require.Contains(t, a.body, `"code":"origin_taken"`)
	}
	steal()

	// The owner retries through the other Host once the killed Host's lease ran out, waiting on
	// the retryable answers as the provider does.
	p.advance("2 minutes")
	var e map[string]any
	deadline := time.Now().Add(60 * time.Second)
	for {
		a, err := p.send(1, http.MethodPut, endpointPath("api"), "token-kill-endpoint-001", endpoint)
		require.NoError(t, err)
		if a.status == http.StatusCreated || a.status == http.StatusOK {
			require.NoError(t, json.Unmarshal([]byte(a.body), &e))
			break
		}
		retryable := a.status == http.StatusConflict && (strings.Contains(a.body, `"code":"witness_open"`) || strings.Contains(a.body, `"code":"intent_in_progress"`))
		require.True(t, retryable && time.Now().Before(deadline), "the owner's retry: %d %s", a.status, a.body)
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, true, e["ready"], "%v", e)
	act := p.must(1, http.MethodPut, reservationsPath+"res-api/activation", "token-kill-activate-001", fmt.Sprintf(`{"endpointUid":%q}`, e["uid"]), http.StatusCreated)
	require.Equal(t, "activated", act["status"])

	p.advance("2 days") // past the TTL: a published origin does not age out
	steal()
}

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }

// TestAHostDrainingOnSIGTERMFinishesItsRequestInFlight: a Host told to stop (SIGTERM) while a
// worker create waits on the runtime node takes no new request, answers the one in flight in full
// once the runtime answers, and exits cleanly; the worker it created is Ready through the other
// Host.
func TestAHostDrainingOnSIGTERMFinishesItsRequestInFlight(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	held := p.admin.armFor(func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/scripts/") && !strings.HasSuffix(r.URL.Path, "/secrets")
	})
	done := make(chan answer, 1)
	go func() {
		a, err := p.send(0, http.MethodPut, workerPath("api"), "token-drain-worker-0001", invariantWorker)
		if err != nil {
			a = answer{status: -1, body: err.Error()}
		}
		done <- a
	}()
	p.waitHeld(held, done, "the worker's script write")
	require.NoError(t, p.procs[0].Process.Signal(syscall.SIGTERM))

	// Draining: the listener is closed, so a new request does not get in.
	require.Eventually(t, func() bool {
		resp, err := http.Get(p.hosts[0].url + "/readyz")
		if err == nil {
			resp.Body.Close()
		}
		return err != nil
	}, 10*time.Second, 50*time.Millisecond, "a draining Host takes no new request")
	select {
	case a := <-done:
		t.Fatalf("the request in flight ended before the runtime answered: %d %s", a.status, a.body)
	default:
	}

	p.admin.release(true)
	a := <-done
	require.Equal(t, http.StatusCreated, a.status, "the request in flight is answered in full: %s", a.body)
	require.NoError(t, p.procs[0].Wait(), "the Host exits cleanly after its drain")
	got := p.must(1, http.MethodGet, workerPath("api"), "", "", http.StatusOK)
	require.Equal(t, true, got["ready"], "%v", got)
}

// TestAHostKilledBeforeItClaimedANewRuntimeInputLeavesItToTheRetry (issue 34 item 1): a Host
// process updating a worker to consume a new runtime input is killed (SIGKILL) while its
// deployment is held at the runtime node, before it claimed the input; the deployment then lands.
// The other Host's recovery ends the request and delivers nothing, leaving the input prepared. The
// owner's retry of the same request, through the other Host, consumes it: settled, delivered
// once, Ready.
func TestAHostKilledBeforeItClaimedANewRuntimeInputLeavesItToTheRetry(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	worker := p.prepared()
	p.must(0, http.MethodPut, workerPath("api"), "token-kill-worker-00001", invariantWorker, http.StatusCreated)

	held := p.admin.armFor(func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/scripts/") && !strings.HasSuffix(r.URL.Path, "/secrets")
	})
	done := make(chan answer, 1)
	go func() {
		a, _ := p.send(0, http.MethodPut, workerPath("api"), "token-kill-worker-00001", worker)
		done <- a
	}()
	p.waitHeld(held, done, "the deployment")
	require.Equal(t, "prepared", p.preparationStatus("op-1"), "nothing is claimed before the deployment")
	p.kill(0)
	<-done
	p.admin.release(true)
	p.advance("2 minutes") // the killed Host's lease runs out by database time
	require.Eventually(t, func() bool {
		var open int
		require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM ownership_intents`).Scan(&open))
		return open == 0
	}, 60*time.Second, 100*time.Millisecond, "recovery ends the killed Host's request")
	require.Equal(t, "prepared", p.preparationStatus("op-1"), "recovery delivers nothing")
	// (The proxy counts the held deployment with the deliveries it forwards.)
	before := p.admin.deliveries.Load()

	got := p.must(1, http.MethodPut, workerPath("api"), "token-kill-worker-00001", worker, http.StatusOK, http.StatusCreated)
	require.Equal(t, "settled", p.preparationStatus("op-1"))
	require.Equal(t, "settled", got["runtimeInputs"].(map[string]any)["status"], "%v", got)
	require.Equal(t, true, got["ready"], "%v", got)
	require.EqualValues(t, before+1, p.admin.deliveries.Load(), "the values went to the runtime once")
}

// The retry of an update whose Host was killed mid-way goes on from the revision its abandoned
// attempt made (issue 34 item 1): the attempt wrote the worker's new generation (a new revision)
// before its deployment, so the owner's retry, the same request with the same If-Match,
// would meet revision_conflict for ever. It is recognised as the same request and completes.
// Another request with that stale If-Match (another body, or another token) still meets
// revision_conflict.
func TestTheRetryOfAKilledUpdateGoesOnFromTheRevisionItsAttemptMade(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	created := p.must(0, http.MethodPut, workerPath("api"), "token-retry-worker-0001", invariantWorker, http.StatusCreated)
	rev := fmt.Sprintf(`"%v"`, created["revision"])
	update := strings.Replace(invariantWorker, "'ok'", "'v2'", 1)
	held := p.admin.armFor(func(r *http.Request) bool {
		return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/scripts/")
	})
	done := make(chan answer, 1)
	go func() {
		a, _ := p.send(0, http.MethodPut, workerPath("api"), "token-retry-worker-0001", update, "If-Match", rev)
		done <- a
	}()
	p.waitHeld(held, done, "the update's deployment")
	p.kill(0)
	<-done
	p.admin.release(true)
	p.advance("2 minutes")
	require.Eventually(t, func() bool {
		var open int
		require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM ownership_intents`).Scan(&open))
		return open == 0
	}, 60*time.Second, 100*time.Millisecond, "recovery ends the killed Host's request")

	other := strings.Replace(invariantWorker, "'ok'", "'v3'", 1)
	conflict, err := p.send(1, http.MethodPut, workerPath("api"), "token-retry-worker-0001", other, "If-Match", rev)
	require.NoError(t, err)
	require.Equal(t, http.StatusConflict, conflict.status, conflict.body)
	require.Contains(t, conflict.body, "revision_conflict", "another request with the stale revision is refused")

	retry, err := p.send(1, http.MethodPut, workerPath("api"), "token-retry-worker-0001", update, "If-Match", rev)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, retry.status, retry.body)
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(retry.body), &got))
	require.EqualValues(t, 2, got["generation"], "%v", got)
	require.Equal(t, true, got["ready"], "%v", got)
}
