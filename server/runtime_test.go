package server_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// routeWatcher sees every route delete the Host makes: it can fail the next one before it reaches
// the runtime, and it runs a check right after one returned.
type routeWatcher struct {
	backend.Mutator
	mu          sync.Mutex
	failNext    bool
	afterDelete func(backend.Desired)
}

func (w *routeWatcher) Unwrap() backend.Mutator { return w.Mutator }

func (w *routeWatcher) Delete(ctx context.Context, d backend.Desired) error {
	if d.Kind != backend.NativeRoute {
		return w.Mutator.Delete(ctx, d)
	}
	w.mu.Lock()
	fail, after := w.failNext, w.afterDelete
	w.failNext = false
	w.mu.Unlock()
	if fail {
		return backend.ErrUnreachable
	}
	if err := w.Mutator.Delete(ctx, d); err != nil {
		return err
	}
	if after != nil {
		after(d)
	}
	return nil
}

// attestation is the status of the deletion attestation of the endpoint uid ("" while none).
func (h *harness) attestation(uid string) string {
	h.t.Helper()
	var s string
	err := h.db.QueryRow(context.Background(), `SELECT coalesce((SELECT status::text FROM deletion_attestations WHERE uid = $1), '')`, uid).Scan(&s)
	require.NoError(h.t, err)
	return s
}

// A destroyed endpoint stops answering at its URL, and its deletion attestation closes only after
// the runtime confirmed the route gone: a delete that could not reach the runtime leaves both the
// route and the attestation open, and its retry closes them in that order.
func TestDestroyedEndpointStopsAnsweringBeforeItsAttestationCloses(t *testing.T) {
	t.Parallel()
	w := &routeWatcher{}
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { w.Mutator = m; return w }
	})
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	host, uid := e["hostname"].(string), e["uid"].(string)
	status, body, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "hello", body)

	// The runtime cannot be reached: the delete fails, the endpoint still answers, and its
	// attestation stays open.
	w.mu.Lock()
	w.failNext = true
	w.mu.Unlock()
	r := h.deleteEndpoint("prod", "api", endpointToken)
	r.problem(t, http.StatusServiceUnavailable, "backend_unreachable")
	require.Equal(t, "open", h.attestation(uid))
	status, _, _ = h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, "a route whose delete never reached the runtime still serves")

	// The retry: right after the runtime removed the route, the edge already refuses the host
	// while the attestation is still open.
	// The check runs on the Host's handler goroutine: it records what it saw, errors included,
	// and the test asserts on its own goroutine.
	type seen struct {
		status      int
		attestation string
		err         error
	}
	seenAfter := make(chan seen, 1)
	w.mu.Lock()
	w.afterDelete = func(backend.Desired) {
		var s seen
		s.status, _, _, s.err = h.runtime.TryGet(host, "/")
		if s.err == nil {
			s.err = h.db.QueryRow(context.Background(), `SELECT coalesce((SELECT status::text FROM deletion_attestations WHERE uid = $1), '')`, uid).Scan(&s.attestation)
		}
		seenAfter <- s
	}
	w.mu.Unlock()
	r = h.deleteEndpoint("prod", "api", endpointToken)
	require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
	var got seen
	select {
	case got = <-seenAfter:
	default:
		t.Fatal("the route delete never reached the runtime")
	}
	require.NoError(t, got.err)
	require.Equal(t, http.StatusNotFound, got.status)
	require.Equal(t, "open", got.attestation)
	require.Equal(t, "closed", h.attestation(uid))
	status, _, _ = h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusNotFound, status)
}

// versionedSecretModule is secretModule that also says which version of the code answers.
func versionedSecretModule(version string) string {
	return strings.Replace(secretModule, `new Response("len="`, `new Response("`+version+` len="`, 1)
}

// A worker whose code changes keeps answering with the values delivered to it: the new revision
// is admitted by the runtime with the delivery it already holds, and the Host never sends the
// values a second time.
func TestCodeChangeKeepsTheDeliveredSecretWithoutASecondDelivery(t *testing.T) {
	t.Parallel()
	var deliveries atomic.Int64
	h := setup(t, func(o *options) {
		o.hooks = runtimeinput.Hooks{BeforeDelivery: func() { deliveries.Add(1) }}
	})
	p := h.reservedAndPrepared()
	body := secretWorkerBody(p.reference)
	body["modules"] = map[string]string{"index.js": versionedSecretModule("v1")}
	w := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	host := e["hostname"].(string)
	status, reply, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, reply)
	require.Equal(t, "v1 "+secretShown(secretCanary), reply)
	require.Equal(t, int64(1), deliveries.Load())

	// The code changes (the same owner, a new intent); the reference and its settled input stay.
	body["modules"] = map[string]string{"index.js": versionedSecretModule("v2")}
	u := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusOK, u.status, "body: %s", u.body)
	uj := u.json(t)
	require.Equal(t, true, uj["ready"], "body: %s", u.body)
	require.Equal(t, map[string]any{"reference": p.reference, "status": "settled"}, uj["runtimeInputs"])
	status, reply, _ = h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, reply)
	require.Equal(t, "v2 "+secretShown(secretCanary), reply)
	require.Equal(t, int64(1), deliveries.Load(), "the values were delivered again for a new revision")
	require.NotContains(t, h.logs.String(), secretCanary)
	require.NotContains(t, h.runtime.Logs.String(), secretCanary)
}

// A worker whose requests keep holding its process's thread gets the process killed by liveness
// each time, and is restarted as the same incarnation: implicated twice, it runs alone (the Host
// shows it quarantined); implicated six times within the hour, the Host shows the runtime's
// incident as a worker condition. The worker still answers, since retries continue.
func TestRepeatedCrashesShowAsAnIncidentOnTheWorker(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.runtime = func(c *runtime.Config) {
			c.LivenessPeriod, c.LivenessTimeout = 200*time.Millisecond, 150*time.Millisecond
		}
	})
	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	body := workerBody()
	body["modules"] = map[string]string{"index.js": `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/loop") for (;;) {}
    return new Response("hello");
  }
}`}
	w := h.putWorker("prod", "api", workerToken, body)
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	script := w.json(t)["scriptName"].(string)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	host := e["hostname"].(string)

	rt := h.runtimeClient()
	ctx := context.Background()
	first, err := rt.GetScript(ctx, script)
	require.NoError(t, err)
	require.NotNil(t, first.Incarnation)
	incarnation := first.Incarnation.ID
	for i := 1; i <= 6; i++ {
		status, _, _ := h.runtime.Get(t, host, "/loop")
		require.GreaterOrEqual(t, status, 500, "the looping request ends with its process")
		require.NoError(t, waitFor(30*time.Second, func() error {
			st, err := rt.GetScript(ctx, script)
			if err != nil {
				return err
			}
			if st.Incarnation == nil || st.Incarnation.Restarts < i || !st.Ready {
				return errors.New("not restarted yet")
			}
			if st.Incarnation.ID != incarnation {
				return errors.New("restarted as another incarnation")
			}
			return nil
		}))
	}

	got := h.get("/v1/spaces/prod/workers/api").json(t)
	conditions := map[string]map[string]any{}
	for _, c := range got["conditions"].([]any) {
		c := c.(map[string]any)
		conditions[c["type"].(string)] = c
	}
	incident := conditions["Incident"]
	require.NotNil(t, incident, "worker: %v", got)
	require.Equal(t, "True", incident["status"])
	require.Equal(t, "RestartLoop", incident["reason"])
	require.NotEmpty(t, incident["message"])
	quarantined := conditions["Quarantined"]
	require.NotNil(t, quarantined, "worker: %v", got)
	require.Equal(t, "True", quarantined["status"])
	require.Equal(t, "RuntimeQuarantined", quarantined["reason"])
	require.Equal(t, true, got["ready"], "a quarantined worker serves, alone")
	status, reply, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "hello", reply)
}

// waitFor polls check until it succeeds or the deadline passes, returning its last error.
func waitFor(deadline time.Duration, check func() error) error {
	end := time.Now().Add(deadline)
	for {
		err := check()
		if err == nil || time.Now().After(end) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A worker that names a new runtime input (its values rotated) takes it in the same PUT: the new
// values are delivered once, the worker reads Ready with the new reference settled, and its URL
// answers with the new value.
func TestWorkerNamingANewRuntimeInputTakesItInTheSamePut(t *testing.T) {
	t.Parallel()
	var deliveries atomic.Int64
	h := setup(t, func(o *options) {
		o.hooks = runtimeinput.Hooks{BeforeDelivery: func() { deliveries.Add(1) }}
	})
	first := h.reservedAndPrepared()
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(first.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	host := e["hostname"].(string)

	const rotated = "tk-canary-rotated-51c7e2"
	second := h.prepare("op-2", "token-prepare-00000002", "res-api", "prod", "api", map[string]string{"API_KEY": rotated})
	require.Equal(t, http.StatusCreated, second.reply.status, "body: %s", second.reply.body)
	u := h.putWorker("prod", "api", workerToken, secretWorkerBody(second.reference))
	require.Equal(t, http.StatusOK, u.status, "body: %s", u.body)
	uj := u.json(t)
	require.Equal(t, true, uj["ready"], "body: %s", u.body)
	require.Equal(t, map[string]any{"reference": second.reference, "status": "settled"}, uj["runtimeInputs"])
	require.Equal(t, int64(2), deliveries.Load())
	require.Equal(t, "settled", h.preparationStatus("op-2"))
	status, reply, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, reply)
	require.Equal(t, secretShown(rotated), reply)
	require.NotContains(t, h.logs.String(), rotated)
}

// outage stands for a runtime node that goes away mid-call: while down, an Apply still reaches
// the runtime but its answer is lost, and every read-back and delete fails.
type outage struct {
	backend.Mutator
	down atomic.Bool
}

func (o *outage) Unwrap() backend.Mutator { return o.Mutator }

func (o *outage) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	obs, err := o.Mutator.Apply(ctx, d)
	if o.down.Load() {
		return backend.Observation{}, backend.ErrUnreachable
	}
	return obs, err
}

func (o *outage) Observe(ctx context.Context, kind, native string) (backend.Observation, error) {
	if o.down.Load() {
		return backend.Observation{}, backend.ErrUnreachable
	}
	return o.Mutator.Observe(ctx, kind, native)
}

func (o *outage) Delete(ctx context.Context, d backend.Desired) error {
	if o.down.Load() {
		return backend.ErrUnreachable
	}
	return o.Mutator.Delete(ctx, d)
}

// A create whose answer was lost while the runtime went away may have landed: the refused
// endpoint's route and the refused worker's script are taken down once the runtime is back, and
// until then the reservation cannot be released, so its origin never passes to anyone while the
// route may still serve.
func TestCreatesWhoseOutcomeIsUnknownAreTakenDownAndFenceTheOrigin(t *testing.T) {
	t.Parallel()
	o := &outage{}
	h := setup(t, func(opts *options) {
		opts.wrap = func(m backend.Mutator) backend.Mutator { o.Mutator = m; return o }
	})
	res := h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).json(t)
	host := strings.TrimPrefix(res["canonicalOrigin"].(string), "http://")
	host = host[:strings.LastIndex(host, ":")]
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)

	o.down.Store(true)
	r := h.putEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
	status, _, _ := h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusOK, status, "the route landed although its answer was lost")
	w := h.putWorker("prod", "other", "token-worker-0000000009", workerBody())
	require.Equal(t, http.StatusServiceUnavailable, w.status, "body: %s", w.body)
	otherScript := h.status(`SELECT script_name FROM workers WHERE name = 'other'`)
	st, err := h.runtimeClient().GetScript(context.Background(), otherScript)
	require.NoError(t, err)
	require.True(t, st.Present, "the script landed although its answer was lost")

	// The route may serve: the reservation's release is fenced, and another organization cannot
	// take the origin.
	p := h.deleteReservation(h.key, "res-api", tokenA).problem(t, http.StatusConflict, "release_fenced")
	require.Contains(t, p["unmetFences"], "deployment_live")

	// The runtime is back: the janitor takes both down, and then the release goes through.
	o.down.Store(false)
	h.host.Sweep(context.Background())
	status, _, _ = h.runtime.Get(t, host, "/")
	require.Equal(t, http.StatusNotFound, status)
	st, err = h.runtimeClient().GetScript(context.Background(), otherScript)
	require.NoError(t, err)
	require.False(t, st.Present)
	require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-api", tokenA).status)
}

// flakyReadback loses the answers of the next readbacks it is told to.
type flakyReadback struct {
	backend.Mutator
	lose atomic.Int64
}

func (f *flakyReadback) Unwrap() backend.Mutator { return f.Mutator }

func (f *flakyReadback) DeliverSecrets(ctx context.Context, d backend.Delivery, values map[string]vocab.Secret) error {
	sink, _ := backend.SinkOf(f.Mutator)
	return sink.DeliverSecrets(ctx, d, values)
}

func (f *flakyReadback) ReadbackSecrets(ctx context.Context, d backend.Delivery, challenge []byte) ([]byte, bool, error) {
	if f.lose.Add(-1) >= 0 {
		return nil, false, backend.ErrUnreachable
	}
	sink, _ := backend.SinkOf(f.Mutator)
	return sink.ReadbackSecrets(ctx, d, challenge)
}

// A readback whose answer is lost once is asked again: the delivered values settle instead of
// failing the runtime input for good.
func TestRuntimeInputSettlesThroughALostReadbackAnswer(t *testing.T) {
	t.Parallel()
	f := &flakyReadback{}
	f.lose.Store(2)
	h := setup(t, func(o *options) {
		o.wrap = func(m backend.Mutator) backend.Mutator { f.Mutator = m; return f }
	})
	p := h.reservedAndPrepared()
	w := h.putWorker("prod", "api", workerToken, secretWorkerBody(p.reference))
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	require.Equal(t, "settled", h.preparationStatus("op-1"))
	require.Less(t, f.lose.Load(), int64(0), "the readback answers were lost")
}

// Code that does not start is a bad input: the PUT is refused with a final 422 (a retry would only
// repeat it), a create leaves nothing behind on the runtime, and an update leaves the previous
// code serving.
func TestCodeThatDoesNotStartIsRefusedAndChangesNothing(t *testing.T) {
	t.Parallel()
	h := setup(t)
	broken := workerBody()
	broken["modules"] = map[string]string{"index.js": "export default { fetch( {"}

	p := h.putWorker("prod", "never", "token-worker-0000000007", broken).problem(t, http.StatusUnprocessableEntity, "deployment_failed")
	require.Contains(t, p["detail"], "fix the code")
	h.get("/v1/spaces/prod/workers/never").problem(t, http.StatusNotFound, "not_found")
	st, err := h.runtimeClient().GetScript(context.Background(), h.status(`SELECT script_name FROM workers WHERE name = 'never'`))
	require.NoError(t, err)
	require.False(t, st.Present, "the refused create left its script on the runtime")

	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	h.putWorker("prod", "api", workerToken, broken).problem(t, http.StatusUnprocessableEntity, "deployment_failed")
	status, reply, _ := h.runtime.Get(t, e["hostname"].(string), "/")
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "hello", reply, "the previous code keeps serving")
}
