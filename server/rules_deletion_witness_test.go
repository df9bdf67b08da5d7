package server_test

// "A deletion opens a deletion attestation for the UID; it closes when the backend confirms
// absence" (SPEC 3.6), and on Cloudflare only once the route propagation window has passed since
// that readback (SPEC 8). The readback of absence is the deletion's only witness: a delete the
// backend accepted, whose readback then fails, proves nothing, on every pack.

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// adminGate stands between the Host and the runtime node's admin API. Armed for a route or a
// script, it lets the object's DELETE through to the runtime, and once the runtime answered it,
// drops the connection of every GET of the object (the Host's readback) without an answer: a
// runtime that stops answering right after it took the object down.
type adminGate struct {
	proxy *httputil.ReverseProxy
	mu    sync.Mutex
	path  string // the armed route's admin path ("" while disarmed)
	// deleted: the runtime answered the armed route's DELETE; dropped counts the readbacks cut.
	deleted bool
	dropped int
}

// front starts the gate in front of the admin API at adminURL and returns the gate's URL.
func (g *adminGate) front(t *testing.T) func(string) string {
	return func(adminURL string) string {
		target, err := url.Parse(adminURL)
		require.NoError(t, err)
		g.proxy = httputil.NewSingleHostReverseProxy(target)
		g.proxy.FlushInterval = -1
		g.proxy.ModifyResponse = func(res *http.Response) error {
			if res.Request.Method == http.MethodDelete && res.StatusCode < 300 {
				g.mu.Lock()
				if g.path != "" && res.Request.URL.Path == g.path {
					g.deleted = true
				}
				g.mu.Unlock()
			}
			return nil
		}
		srv := httptest.NewServer(g)
		t.Cleanup(srv.Close)
		return srv.URL
	}
}

func (g *adminGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	drop := r.Method == http.MethodGet && g.deleted && r.URL.Path == g.path
	if drop {
		g.dropped++
	}
	g.mu.Unlock()
	if drop {
		panic(http.ErrAbortHandler) // the connection closes with no answer
	}
	g.proxy.ServeHTTP(w, r)
}

// arm makes the readbacks of the object at admin path fail once its delete landed.
func (g *adminGate) arm(path string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.path, g.deleted, g.dropped = path, false, 0
}

// disarm lets every call through again and says whether the armed delete landed and how many
// readbacks were cut.
func (g *adminGate) disarm() (deleted bool, dropped int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	deleted, dropped = g.deleted, g.dropped
	g.path, g.deleted, g.dropped = "", false, 0
	return deleted, dropped
}

// afterRouteDelete is a backend whose route deletes run as they would; right after one the
// backend accepted, it runs the armed fault once (on the Host's goroutine), so that what fails is
// the Host's own readback of absence. Every installation's mutator shares one afterRouteDelete.
type afterRouteDelete struct {
	mu    sync.Mutex
	fault func() error
	ran   bool
	err   error
}

type afterRouteDeleteMutator struct {
	backend.Mutator
	w *afterRouteDelete
}

func (m afterRouteDeleteMutator) Unwrap() backend.Mutator { return m.Mutator }

func (m afterRouteDeleteMutator) Delete(ctx context.Context, d backend.Desired) error {
	err := m.Mutator.Delete(ctx, d)
	if err != nil || d.Kind != backend.NativeRoute {
		return err
	}
	m.w.mu.Lock()
	defer m.w.mu.Unlock()
	if m.w.fault != nil {
		m.w.err, m.w.ran = m.w.fault(), true
		m.w.fault = nil
	}
	return nil
}

func (w *afterRouteDelete) wrap(m backend.Mutator) backend.Mutator {
	return afterRouteDeleteMutator{Mutator: m, w: w}
}

func (w *afterRouteDelete) arm(fault func() error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fault, w.ran, w.err = fault, false, nil
}

// outcome says whether the armed fault ran, and its error.
func (w *afterRouteDelete) outcome() (bool, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ran, w.err
}

// waitClosed polls, on the test's goroutine, until uid's attestation reads closed.
func (h *harness) waitClosed(uid string, within time.Duration) {
	h.t.Helper()
	var last string
	err := waitFor(within, func() error {
		if last = h.attestationView(uid); last != "closed" {
			return fmt.Errorf("the attestation of %s is %s", uid, last)
		}
		return nil
	})
	require.NoError(h.t, err)
}

// requireReleaseFencedByTheAttestation: the reservation's release is refused while the endpoint's
// attestation is open.
func (h *harness) requireReleaseFencedByTheAttestation(id, token string) {
	h.t.Helper()
	p := h.deleteReservation(h.key, id, token).problem(h.t, http.StatusConflict, "release_fenced")
	require.Contains(h.t, p["unmetFences"], "attestation_open")
}

// TestRuleADeletionClosesOnlyOnAReadbackOfAbsence: "A deletion opens a deletion attestation for the
// UID; it closes when the backend confirms absence" (SPEC 3.6); on Cloudflare, "the route counts as
// deleted ... only once routePropagationSeconds have passed since the readback. Only then does the
// deletion attestation close" (SPEC 8). On each pack the backend accepts an endpoint's delete (the
// route is really gone; on selfhost a worker's too) and then the Host's readback of absence gets
// no answer: the Host answers
// 503 backend_unreachable, the attestation stays open and keeps fencing the origin (and, on
// Cloudflare, no propagation window was started from nothing); a retry whose readback succeeds
// closes the deletion normally.
func TestRuleADeletionClosesOnlyOnAReadbackOfAbsence(t *testing.T) {
	t.Parallel()
	const resTok, endTok = "token-res-a-000000001", "token-end-a-000000001"
	const otherTok = "token-res-b-000000001"

	t.Run("selfhost", func(t *testing.T) {
		t.Parallel()
		gate := &adminGate{}
		h := setup(t, func(o *options) { o.runtimeAdmin = gate.front(t) })
		shop := map[string]any{"space": "prod", "workerName": "api", "subdomain": "shop"}
		res := h.putReservation(h.key, "res-api", resTok, shop)
		require.Equal(t, http.StatusCreated, res.status, "body: %s", res.body)
		origin := res.json(t)["canonicalOrigin"]
		script := h.mustWorker("prod", "api", workerToken)["scriptName"].(string)
		e := h.mustEndpoint("prod", "api", endTok, map[string]any{"worker": "api", "originReservationId": "res-api"})
		host, uid := e["hostname"].(string), e["uid"].(string)
		status, _, _ := h.runtime.Get(t, host, "/")
		require.Equal(t, http.StatusOK, status)

		gate.arm(adminapi.RoutePath(host))
		h.deleteEndpoint("prod", "api", endTok).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
		deleted, dropped := gate.disarm()
		require.True(t, deleted, "the runtime accepted the route's delete")
		require.Positive(t, dropped, "the Host's readback was cut")
		status, _, _ = h.runtime.Get(t, host, "/")
		require.Equal(t, http.StatusNotFound, status, "the route is really gone from the runtime")
		require.Equal(t, "open", h.attestation(uid), "an accepted delete without a readback of absence confirms nothing")
		require.Equal(t, "open", h.attestationView(uid))
		require.Equal(t, 1, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND status <> 'deleted'`, uid))
		h.requireReleaseFencedByTheAttestation("res-api", resTok)
		_, otherKey := h.newOrg("globex")
		h.putReservation(otherKey, "res-steal", otherTok, map[string]any{"space": "web", "workerName": "front", "subdomain": "shop"}).
			problem(t, http.StatusConflict, "origin_taken")

		// The retry reads absence back: the deletion closes, the origin is free.
		r := h.deleteEndpoint("prod", "api", endTok)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, "closed", h.attestation(uid))
		require.Equal(t, http.StatusOK, h.deleteReservation(h.key, "res-api", resTok).status)
		taken := h.putReservation(otherKey, "res-steal", otherTok, map[string]any{"space": "web", "workerName": "front", "subdomain": "shop"})
		require.Equal(t, http.StatusCreated, taken.status, "body: %s", taken.body)
		require.Equal(t, origin, taken.json(t)["canonicalOrigin"])

		// The worker's own deletion: the runtime takes its script down, its readback is cut.
		workerUID := h.get("/v1/spaces/prod/workers/api").json(t)["uid"].(string)
		gate.arm(adminapi.ScriptPath(script))
		h.deleteWorker("prod", "api", workerToken).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
		deleted, dropped = gate.disarm()
		require.True(t, deleted, "the runtime accepted the script's delete")
		require.Positive(t, dropped, "the Host's readback was cut")
		st, err := h.runtimeClient().GetScript(context.Background(), script)
		require.NoError(t, err)
		require.False(t, st.Present, "the script is really gone from the runtime")
		require.Equal(t, "open", h.attestation(workerUID), "an accepted delete without a readback of absence confirms nothing")
		r = h.deleteWorker("prod", "api", workerToken)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, "closed", h.attestation(workerUID))
	})

	// cloudflare runs the rule on one Cloudflare pack: readbackPath is the part of the API path of
	// the route's readback, which the stand-in stops answering once the pack's delete returned.
	cloudflare := func(t *testing.T, workerOffering, endpointOffering string, subdomain string, body map[string]any,
		readbackPath func(script, host string) string) {
		w := &afterRouteDelete{}
		h, s := setupCloudflareHost(t, func(o *options) { o.wrap = w.wrap })
		r := h.putWorker("prod", "api", tokenA, body)
		require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
		script := r.json(t)["scriptName"].(string)
		resBody := map[string]any{"space": "prod", "workerName": "api", "offeringId": workerOffering}
		if subdomain != "" {
			resBody["subdomain"] = subdomain
		}
		res := h.putReservation(h.key, "res-api", resTok, resBody)
		require.Equal(t, http.StatusCreated, res.status, "body: %s", res.body)
		e := h.mustEndpoint("prod", "api", endTok, map[string]any{"worker": "api", "offeringId": endpointOffering, "originReservationId": "res-api"})
		host, uid := e["hostname"].(string), e["uid"].(string)
		require.Equal(t, true, e["ready"], "endpoint: %v", e)

		// Cloudflare takes the route down; then its API stops answering the route's readback.
		w.arm(func() error {
			return s.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodGet, PathContains: readbackPath(script, host), Times: 50})
		})
		h.deleteEndpoint("prod", "api", endTok).problem(t, http.StatusServiceUnavailable, "backend_unreachable")
		ran, err := w.outcome()
		require.True(t, ran, "the pack's delete was accepted")
		require.NoError(t, err)
		require.Positive(t, apiCalls(s, http.MethodGet, readbackPath(script, host)))
		require.Equal(t, "open", h.attestation(uid), "an accepted delete without a readback of absence confirms nothing")
		require.Equal(t, "open", h.attestationView(uid))
		require.Zero(t, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND (status = 'deleted' OR routed_until IS NOT NULL)`, uid),
			"no propagation window was started without a readback")
		h.requireReleaseFencedByTheAttestation("res-api", resTok)
		if subdomain != "" {
			_, otherKey := h.newOrg("globex")
			h.putReservation(otherKey, "res-steal", otherTok, map[string]any{"space": "web", "workerName": "front", "subdomain": subdomain, "offeringId": workerOffering}).
				problem(t, http.StatusConflict, "origin_taken")
		}

		// The retry reads absence back: the window runs from that readback, then the deletion
		// closes and the reservation can go.
		s.ClearFaults()
		r = h.deleteEndpoint("prod", "api", endTok)
		require.Equal(t, http.StatusOK, r.status, "body: %s", r.body)
		require.Equal(t, 1, h.count(`SELECT count(*) FROM deployments WHERE resource_uid = $1 AND status = 'deleted' AND routed_until > now()`, uid))
		require.Equal(t, "open", h.attestationView(uid), "the attestation waits for the propagation window")
		h.waitClosed(uid, 10*cfPropagation)
		rel := h.deleteReservation(h.key, "res-api", resTok)
		require.Equal(t, http.StatusOK, rel.status, "body: %s", rel.body)
	}

	t.Run("workers-dev", func(t *testing.T) {
		t.Parallel()
		cloudflare(t, "cf-worker", "cf-endpoint", "", cfWorkerBody(`export default { fetch() { return new Response("cf-witness") } }`),
			func(script, _ string) string { return "/scripts/" + script + "/subdomain" })
	})
	t.Run("wfp-managed", func(t *testing.T) {
		t.Parallel()
		b := wfpWorkerBody("wfp-witness")
		cloudflare(t, "wfp-worker", "wfp-endpoint", "shop", b,
			func(_, host string) string { return "/values/" + host })
	})
}
