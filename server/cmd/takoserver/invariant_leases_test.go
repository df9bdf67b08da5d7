package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// The moves of the invariant test that make progress (publishing an endpoint, activating it,
// delivering a runtime input) and the one that kills a Host mid-dispatch, with the lease
// invariants and the end-of-sequence checks.

// noteEndpoint keeps what endpoint PUTs and DELETEs answered, and counts creates.
func (w *world) noteEndpoint(org tenant, method, name string, a answer, ok bool) {
	_, known := w.endpoints[org.name][name]
	switch {
	case method == http.MethodPut && !known:
		w.progress.endpointCreates++
		if a.status == http.StatusCreated {
			w.progress.endpointCreated++
		}
	case method == http.MethodDelete && ok:
		delete(w.endpoints[org.name], name)
		return
	}
	if method == http.MethodPut && ok {
		w.rememberEndpoint(org, name, a.body)
	}
}

func (w *world) rememberEndpoint(org tenant, name, body string) {
	var e map[string]any
	if json.Unmarshal([]byte(body), &e) != nil {
		return
	}
	uid, _ := e["uid"].(string)
	res, _ := e["originReservationId"].(string)
	minted, _ := e["hostMinted"].(bool)
	w.endpoints[org.name][name] = seenEndpoint{uid: uid, reservation: res, hostMinted: minted}
}

func (w *world) liveWorkers(org tenant) []string {
	var names []string
	for n, ok := range w.workers[org.name] {
		if ok {
			names = append(names, n)
		}
	}
	sortStrings(names)
	return names
}

func (w *world) reservationsOf(org tenant, worker string) []string {
	var ids []string
	for id, wk := range w.reservations[org.name] {
		if wk == worker {
			ids = append(ids, id)
		}
	}
	sortStrings(ids)
	return ids
}

// freeReservationID is a reservation id org does not hold, when there is one.
func (w *world) freeReservationID(org tenant) string {
	for range 6 {
		if id := w.reservationID(); w.reservations[org.name][id] == "" {
			return id
		}
	}
	return w.reservationID()
}

func workerPath(name string) string { return "/v1/spaces/" + invariantSpace + "/workers/" + name }
func endpointPath(name string) string {
	return "/v1/spaces/" + invariantSpace + "/worker-endpoints/" + name
}

const reservationsPath = "/v1/worker-endpoint-origin-reservations/"

// publish is the next request that brings one of an organization's workers closer to a
// published, activated endpoint: a worker, a reservation for it (or none: the Host mints one), the
// endpoint, its activation; and now and then the endpoint's delete, so that the cycle continues.
func (w *world) publish() {
	org, h := w.anyOrg(), w.anyHost()
	workers := w.liveWorkers(org)
	if len(workers) == 0 {
		w.do(mutation{org, http.MethodPut, workerPath(w.workerName()), invariantWorker}, h)
		return
	}
	worker := workers[w.pick(len(workers))]
	name := endpointOf(worker)
	if e, ok := w.endpoints[org.name][name]; ok {
		if !e.hostMinted && e.reservation != "" && w.pick(4) > 0 {
			w.do(mutation{org, http.MethodPut, reservationsPath + e.reservation + "/activation", fmt.Sprintf(`{"endpointUid":%q}`, e.uid)}, h)
			return
		}
		if !e.hostMinted && e.reservation != "" {
			w.do(mutation{org, http.MethodDelete, reservationsPath + e.reservation + "/activation", ""}, h)
		}
		w.do(mutation{org, http.MethodDelete, endpointPath(name), ""}, h)
		return
	}
	ids := w.reservationsOf(org, worker)
	switch {
	case len(ids) == 0 && w.pick(3) == 0:
		w.do(mutation{org, http.MethodPut, endpointPath(name), fmt.Sprintf(`{"worker":%q}`, worker)}, h)
	case len(ids) == 0:
		// No subdomain: the Host derives the worker's own label, which no other organization wants.
		w.do(mutation{org, http.MethodPut, reservationsPath + w.freeReservationID(org), fmt.Sprintf(`{"space":%q,"workerName":%q}`, invariantSpace, worker)}, h)
	default:
		w.do(mutation{org, http.MethodPut, endpointPath(name), fmt.Sprintf(`{"worker":%q,"originReservationId":%q}`, worker, ids[w.pick(len(ids))])}, h)
	}
}

// prepare makes a runtime input for worker on reservation id, its one binding a fresh canary,
// the way the provider does; it answers the reference, or "" when the Host refused.
func (w *world) prepare(org tenant, h host, worker, id string) string {
	a, err := w.send(h, org, http.MethodGet, reservationsPath+id, "", "")
	if err != nil || a.status != http.StatusOK {
		return ""
	}
	var res map[string]any
	if json.Unmarshal([]byte(a.body), &res) != nil {
		return ""
	}
	origin, _ := res["canonicalOrigin"].(string)
	w.mu.Lock()
	w.serial++
	n := w.serial
	w.mu.Unlock()
	op := fmt.Sprintf("op-%d", n)
	nonce := fmt.Sprintf("nonce-%d-%d", w.seed, n)
	value := vocab.NewSecret(fmt.Sprintf("%s%d", w.canary, n))
	target := runtimeinput.Target{Space: invariantSpace, WorkerName: worker, BundleName: "main", EndpointName: endpointOf(worker),
		OriginReservationID: id, CanonicalPublicOrigin: origin}
	ref := runtimeinput.Derive(nonce, target, map[string]vocab.Secret{"API_KEY": value}).Reference
	body, _ := json.Marshal(map[string]any{
		"format": runtimeinput.PreparationFormat, "materialSetNonce": nonce, "runtimeInputReference": ref,
		"target":   map[string]any{"space": invariantSpace, "workerName": worker, "bundleName": "main", "endpointName": endpointOf(worker), "originReservationId": id},
		"bindings": map[string]string{"API_KEY": value.Reveal()},
	})
	path := "/v1/organizations/" + org.id + "/worker-runtime-input-preparations/" + op
	a, err = w.send(h, org, http.MethodPut, path, string(body), "")
	w.note(org, http.MethodPut, path, a, err)
	if err != nil || a.status != http.StatusCreated {
		return ""
	}
	w.preparations = append(w.preparations, seenPreparation{org: org, operationID: op})
	return ref
}

// consume delivers a runtime input to one of org's reserved workers (a first delivery, or a
// rotation when it has one already), or deletes an earlier preparation.
func (w *world) consume(org tenant, h host) {
	if len(w.preparations) > 0 && w.pick(5) == 0 {
		p := w.preparations[w.pick(len(w.preparations))]
		path := "/v1/organizations/" + p.org.id + "/worker-runtime-input-preparations/" + p.operationID
		w.do(mutation{p.org, http.MethodDelete, path, ""}, h)
		return
	}
	var ids []string
	for id := range w.reservations[org.name] {
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		w.do(mutation{org, http.MethodPut, reservationsPath + w.freeReservationID(org), w.reservationBody(org)}, h)
		return
	}
	sortStrings(ids)
	id := ids[w.pick(len(ids))]
	worker := w.reservations[org.name][id]
	ref := w.prepare(org, h, worker, id)
	if ref == "" {
		return
	}
	a, err := w.send(h, org, http.MethodPut, workerPath(worker), fmt.Sprintf(secretWorker, ref), "")
	w.note(org, http.MethodPut, workerPath(worker), a, err)
	w.progress.consumptions++
	var got map[string]any
	if err == nil && a.status < 300 && json.Unmarshal([]byte(a.body), &got) == nil {
		if ri, _ := got["runtimeInputs"].(map[string]any); ri != nil && ri["status"] == "settled" {
			w.progress.settled++
		}
	}
}

// killMidDispatch delivers a runtime input through one Host, holds its delivery at the runtime's
// admin API, kills that Host (SIGKILL) while the delivery is held, then lets the delivery through
// or drops it, restarts the Host and waits for recovery to conclude the lease: settled when the
// values landed (readback), failed when they did not; never delivered twice.
func (w *world) killMidDispatch() {
	w.t.Helper()
	org, i := w.orgs[0], w.pick(len(w.hosts))
	h := w.hosts[i]
	const worker, id = "wk", "res-k"
	a, err := w.send(h, org, http.MethodPut, reservationsPath+id, fmt.Sprintf(`{"space":%q,"workerName":%q}`, invariantSpace, worker), "")
	require.NoError(w.t, err)
	require.Contains(w.t, []int{http.StatusOK, http.StatusCreated}, a.status, "reservation %s: %s", id, a.body)
	ref := w.prepare(org, h, worker, id)
	require.NotEmpty(w.t, ref, "the preparation for the mid-dispatch kill")
	op := w.preparations[len(w.preparations)-1].operationID

	// The delivery of this worker is held at whichever node it reaches first (in a pool, the Host
	// gives the sealed blob to each member in turn: the others never see it from this Host).
	script := "/v1/scripts/" + backend.ScriptName(backend.WorkerRef{TenantRef: org.id, Space: invariantSpace, Name: worker}) + "/secrets"
	proxies := w.nodeProxies()
	held := make(chan struct{}, len(proxies))
	stop := make(chan struct{})
	for _, p := range proxies {
		ch := p.armFor(func(r *http.Request) bool { return isDelivery(r) && r.URL.Path == script })
		go func() {
			select {
			case <-ch:
				held <- struct{}{}
			case <-stop:
			}
		}()
	}
	done := make(chan answer, 1)
	consume := func() {
		a, _ := w.send(h, org, http.MethodPut, workerPath(worker), fmt.Sprintf(secretWorker, ref), "")
		done <- a
	}
	go consume()
	// A pool that just lost a node may fail the deployment before its delivery (a member still
	// read serving, that does not answer): the consumption is applied again, as the provider does.
	for attempt := 1; ; attempt++ {
		select {
		case <-held:
		case a := <-done:
			if (a.status == http.StatusBadGateway || a.status == http.StatusServiceUnavailable) && w.members != nil && attempt < 5 {
				w.log = append(w.log, fmt.Sprintf("%s PUT %s on host %d -> %d before its delivery, applied again", org.name, workerPath(worker), i, a.status))
				time.Sleep(2 * time.Second)
				go consume()
				continue
			}
			w.fail("the consumption for the mid-dispatch kill never reached its delivery: %d %s", a.status, a.body)
		case <-time.After(90 * time.Second):
			w.fail("the consumption for the mid-dispatch kill never reached its delivery in 90s")
		}
		break
	}
	require.NoError(w.t, w.procs[i].Process.Signal(syscall.SIGKILL))
	_ = w.procs[i].Wait()
	<-done
	close(stop)
	forward := w.pick(2) == 0
	for _, p := range proxies {
		p.disarm()
		p.release(forward) // the held one goes on (or is dropped); the others hold nothing
	}
	w.progress.midDispatchKills++
	w.log = append(w.log, fmt.Sprintf("%s PUT %s on host %d -> killed mid-dispatch (delivery %s)", org.name, workerPath(worker), i,
		map[bool]string{true: "landed", false: "dropped"}[forward]))
	w.restart(i)

	// Recovery (either Host's janitor) concludes the lease by readback. A delivery let through may
	// still reach the runtime after that readback found it absent: the runtime then refuses it, so
	// the lease may end failed either way, but a failed lease's delivery never lands.
	var status, delivery string
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		require.NoError(w.t, w.db.QueryRow(context.Background(), `SELECT status, material_set_id::text FROM runtime_input_preparations WHERE operation_id = $1`, op).Scan(&status, &delivery))
		if status != "dispatched" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status != "settled" && status != "failed" {
		w.fail("a lease whose Host was killed mid-dispatch ended %q, not settled or failed", status)
	}
	if !forward && status != "failed" {
		w.fail("a lease whose delivery was dropped with its Host ended %q, not failed", status)
	}
	if status != "failed" {
		return // settled by readback: delivered once (recovery may since have deleted a create that never committed)
	}
	// Failed: its delivery never lands now, on any node. A refused copy is answered at once; one
	// still being applied would show within the wait.
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		for _, v := range w.runtimeViews() {
			for _, sc := range v.st.Scripts {
				if sc.Present && sc.Secrets.Delivered && sc.Secrets.DeliveryID == delivery {
					w.fail("a lease whose Host was killed mid-dispatch ended failed, and then its delivery landed on script %s of runtime %s", sc.ScriptName, v.name)
				}
			}
		}
	}
}

// checkLeases states the one-shot lease of SPEC 3.5: sealed values exist only while a preparation
// is prepared or claimed; whatever the runtime holds for a script came from a preparation that was
// dispatched to that very worker UID; and no delivery is held by two scripts.
func (w *world) checkLeases(views []runtimeView) {
	w.t.Helper()
	ctx := context.Background()
	var bad int
	require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*) FROM runtime_input_preparations
		WHERE ciphertext IS NOT NULL AND status NOT IN ('prepared', 'claimed')`).Scan(&bad))
	if bad > 0 {
		w.fail("%d preparation(s) keep sealed values after their dispatch", bad)
	}
	if w.node.poolPublicKey != "" {
		// A pool (SPEC 6.2): the newest settled delivery of every live worker of the node,
		// of the runtime input it consumes now, is kept sealed to the pool.
		require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*) FROM runtime_input_preparations p
			JOIN workers w ON w.uid = p.worker_uid AND w.organization_id = p.organization_id AND w.runtime_input_reference = p.reference
			WHERE p.installation = 'selfhost' AND p.status = 'settled' AND p.pool_blob IS NULL AND w.status = 'live'
			  AND NOT EXISTS (SELECT 1 FROM runtime_input_preparations o
			                  WHERE o.worker_uid = p.worker_uid AND o.status = 'settled' AND o.dispatched_at > p.dispatched_at)`).Scan(&bad))
		if bad > 0 {
			w.fail("%d live worker(s) of the pool have their newest settled delivery without its pool blob", bad)
		}
		var blobs int
		require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*) FROM runtime_input_preparations WHERE pool_blob IS NOT NULL`).Scan(&blobs))
		w.progress.poolBlobs = max(w.progress.poolBlobs, blobs)
	}
	for _, v := range views {
		seen := map[string]string{}
		for _, s := range v.st.Scripts {
			if !s.Present || !s.Secrets.Delivered {
				continue
			}
			if other, ok := seen[s.Secrets.DeliveryID]; ok {
				w.fail("delivery %s is held by scripts %s and %s on runtime %s", s.Secrets.DeliveryID, other, s.ScriptName, v.name)
			}
			seen[s.Secrets.DeliveryID] = s.ScriptName
			require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*) FROM runtime_input_preparations
				WHERE material_set_id = $1::uuid AND worker_uid = $2::uuid AND dispatched_at IS NOT NULL`, s.Secrets.DeliveryID, s.WorkerUID).Scan(&bad))
			if bad != 1 {
				w.fail("runtime %s holds delivery %s for worker %s (script %s), which no preparation dispatched to that worker", v.name, s.Secrets.DeliveryID, s.WorkerUID, s.ScriptName)
			}
		}
	}
}

// finish asserts the sequence made progress, and that no canary leaked anywhere it could be read.
func (w *world) finish() {
	w.t.Helper()
	p := w.progress
	w.t.Logf("progress: %d of %d endpoint creates (%d on workers-dev), %d of %d activations, %d of %d consumptions settled, %d mid-dispatch kill(s), up to %d script(s) on the stand-in",
		p.endpointCreated, p.endpointCreates, p.wdEndpointCreated, p.activated, p.activations, p.settled, p.consumptions, p.midDispatchKills, p.wdScriptsSeen)
	share := func(ok, of int) float64 {
		if of == 0 {
			return 0
		}
		return float64(ok) / float64(of)
	}
	// A pool's sequence loses nodes, and requests fail meanwhile by design: half the shares. Its
	// timing decides how many activations it attempts (few, on some runs of a seed): their share
	// counts from five.
	minCreates, minActivations, fewActivations := minEndpointCreateShare, minActivationShare, false
	if w.members != nil {
		minCreates, minActivations, fewActivations = minCreates/2, minActivations/2, p.activations < 5
	}
	if s := share(p.endpointCreated, p.endpointCreates); s < minCreates {
		w.fail("only %d of %d endpoint creates succeeded (%.0f%% < %.0f%%): the sequence made no real progress", p.endpointCreated, p.endpointCreates, 100*s, 100*minCreates)
	}
	if s := share(p.activated, p.activations); s < minActivations && !fewActivations {
		w.fail("only %d of %d activations succeeded (%.0f%% < %.0f%%): the sequence made no real progress", p.activated, p.activations, 100*s, 100*minActivations)
	}
	if p.settled == 0 {
		w.fail("no runtime input was delivered and settled in %d consumptions", p.consumptions)
	}
	if w.node.poolPublicKey != "" {
		var local int
		require.NoError(w.t, w.db.QueryRow(context.Background(), `SELECT count(*) FROM runtime_input_preparations
			WHERE installation = 'selfhost' AND status IN ('dispatched', 'settled')`).Scan(&local))
		if local > 0 && p.poolBlobs == 0 {
			var rows string
			_ = w.db.QueryRow(context.Background(), `SELECT string_agg(format('%s %s %s blob=%s worker=%s ref=%s', p.operation_id, p.installation, p.status, p.pool_blob IS NOT NULL, w.status, w.runtime_input_reference = p.reference), '; ')
				FROM runtime_input_preparations p LEFT JOIN workers w ON w.uid = p.worker_uid`).Scan(&rows)
			w.t.Logf("the preparations: %s", rows)
			w.fail("the pool's sequence dispatched %d runtime input(s) to its node and never kept one sealed to the pool", local)
		}
		w.t.Logf("pool: %d runtime input(s) dispatched to the node, up to %d kept sealed to the pool at once", local, p.poolBlobs)
	}

	bin, err := pgcluster.BinDir()
	require.NoError(w.t, err)
	dump, err := exec.Command(filepath.Join(bin, "pg_dump"), "--data-only", "--inserts", w.dbURL).CombinedOutput()
	require.NoError(w.t, err, string(dump))
	texts := map[string]string{"the Host's answers": w.answers.String(), "pg_dump": string(dump)}
	for i, l := range w.hostLogs {
		texts[fmt.Sprintf("Host process %d's log", i)] = l.String()
	}
	for where, text := range texts {
		if chain, found := leakscan.FindString(text, w.canary); found {
			w.fail("a runtime input's value is in %s (encoded as %q)", where, chain)
		}
	}
}

// heldAdmin is a proxy in front of the runtime node's admin API that, when armed, holds the next
// secret delivery until the test lets it through or drops it.
type heldAdmin struct {
	url     string
	mu      sync.Mutex
	armed   bool
	match   func(*http.Request) bool // what the armed proxy holds
	held    chan struct{}
	decided chan bool
	// deliveries counts the secret deliveries that went on to the runtime node.
	deliveries atomic.Int64
	// cut, while set, answers every request 502 as a gateway does for a node it cannot reach: the
	// node runs on, and its edge serves, but the Hosts cannot reach its admin API (a partition).
	cut atomic.Bool
}

// isDelivery matches a secret delivery to the runtime node.
func isDelivery(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets")
}

// isRoutePut matches a route write to the runtime node.
func isRoutePut(r *http.Request) bool {
	return r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/routes/")
}

func holdAdmin(t interface {
	Cleanup(func())
	Helper()
}, target string) *heldAdmin {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		panic(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	proxy.ErrorLog = log.New(io.Discard, "", 0) // a killed Host's requests end in errors on purpose
	a := &heldAdmin{}
	srv := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if a.cut.Load() {
			http.Error(rw, "upstream unreachable", http.StatusBadGateway)
			return
		}
		a.mu.Lock()
		match := a.match
		a.mu.Unlock()
		if match != nil && match(r) {
			a.mu.Lock()
			armed, held, decided := a.armed, a.held, a.decided
			a.armed = false
			a.mu.Unlock()
			if armed {
				body, err := io.ReadAll(r.Body)
				if err != nil {
					panic(http.ErrAbortHandler)
				}
				held <- struct{}{}
				if !<-decided {
					panic(http.ErrAbortHandler) // dropped: the runtime never sees it
				}
				// The Host that sent it is gone; the delivery lands all the same. It is sent on its
				// own, not through the reverse proxy, which would cancel it as soon as it noticed
				// that the client's connection had closed.
				out, err := http.NewRequestWithContext(context.Background(), r.Method, u.String()+r.URL.RequestURI(), bytes.NewReader(body))
				if err != nil {
					panic(err)
				}
				out.Header = r.Header.Clone()
				a.deliveries.Add(1)
				resp, err := http.DefaultTransport.RoundTrip(out)
				if err != nil {
					panic(http.ErrAbortHandler)
				}
				defer resp.Body.Close()
				rw.WriteHeader(resp.StatusCode)
				_, _ = io.Copy(rw, resp.Body)
				return
			}
		}
		if isDelivery(r) {
			a.deliveries.Add(1)
		}
		proxy.ServeHTTP(rw, r)
	}))
	t.Cleanup(func() {
		a.mu.Lock()
		decided := a.decided
		a.mu.Unlock()
		if decided != nil {
			select {
			case decided <- false:
			default:
			}
		}
		srv.Close()
	})
	a.url = srv.URL
	return a
}

// arm holds the next delivery; the channel says when it is held.
func (a *heldAdmin) arm() <-chan struct{} { return a.armFor(isDelivery) }

// armFor holds the next request that match matches.
func (a *heldAdmin) armFor(match func(*http.Request) bool) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armed, a.match, a.held, a.decided = true, match, make(chan struct{}, 1), make(chan bool, 1)
	return a.held
}

func (a *heldAdmin) disarm() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.armed = false
}

// release lets the held delivery through (forward) or drops it.
func (a *heldAdmin) release(forward bool) {
	a.mu.Lock()
	decided := a.decided
	a.mu.Unlock()
	decided <- forward
}
