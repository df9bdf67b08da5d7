package runtime

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/supervisor"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

const (
	maxBody       = 32 << 20 // a bundle's modules travel in one script PUT
	maxEffects    = 10000    // remembered effect ids; the oldest are forgotten first
	effectIDLimit = 200
)

var (
	scriptNamePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	hostnamePattern   = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$`)
	idPattern         = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`)
)

// handlerFunc is an admin handler: it answers a value (written as JSON) or a problem.
type handlerFunc func(w http.ResponseWriter, r *http.Request) (any, error)

// adminHandler is the admin API's one route table.
func (n *Node) adminHandler() http.Handler {
	mux := http.NewServeMux()
	route := func(pattern string, h handlerFunc) { mux.Handle(pattern, n.authed(h)) }
	route("PUT "+adminapi.PatternScript, n.putScript)
	route("GET "+adminapi.PatternScript, n.getScript)
	route("DELETE "+adminapi.PatternScript, n.deleteScript)
	route("PUT "+adminapi.PatternScriptSecrets, n.putSecrets)
	route("DELETE "+adminapi.PatternScriptSecrets, n.deleteSecrets)
	route("POST "+adminapi.PatternScriptReadback, n.readback)
	route("GET "+adminapi.PatternScriptLogs, n.getLogs)
	route("PUT "+adminapi.PatternRoute, n.putRoute)
	route("GET "+adminapi.PatternRoute, n.getRoute)
	route("DELETE "+adminapi.PatternRoute, n.deleteRoute)
	route("GET "+adminapi.PathStatus, n.status)
	route("GET "+adminapi.PathBrakes, n.getBrakes)
	route("POST "+adminapi.PathLifecycleBrake, n.setLifecycleBrake)
	// Metrics name every tenant's scripts: they need the token like every other route (SPEC 5.1).
	mux.Handle("GET "+adminapi.PathMetrics, n.withToken(promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{})))
	mux.HandleFunc("GET "+adminapi.PathHealth, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		n.writeProblem(w, r, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeNotFound, "Not Found", "no such admin route"))
	})
	return mux
}

// withToken lets a request through to next only with the admin bearer token (constant-time
// compare); any other gets a 401 problem.
func (n *Node) withToken(next http.Handler) http.Handler {
	want := []byte("Bearer " + n.store.Token())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="takoform-runtime"`)
			n.writeProblem(w, r, adminapi.NewProblem(http.StatusUnauthorized, adminapi.CodeUnauthorized, "Unauthorized",
				"send Authorization: Bearer <the token in the runtime's admin-token file>"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authed checks the bearer token, then runs h and writes its answer.
func (n *Node) authed(h handlerFunc) http.Handler {
	return n.withToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		v, err := h(w, r)
		if err != nil {
			var p *adminapi.Problem
			if !errors.As(err, &p) {
				n.log.Error("admin request failed", "method", r.Method, "path", r.URL.Path, "error", err)
				p = adminapi.NewProblem(http.StatusInternalServerError, adminapi.CodeInternal, "Internal Server Error", "see the runtime node's log")
			}
			n.writeProblem(w, r, p)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(v)
	}))
}

func (n *Node) writeProblem(w http.ResponseWriter, r *http.Request, p *adminapi.Problem) {
	if p.Status >= 500 {
		n.log.Warn("admin problem", "method", r.Method, "path", r.URL.Path, "status", p.Status, "code", p.Code)
	}
	w.Header().Set("Content-Type", adminapi.ProblemContentType)
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

func invalid(format string, args ...any) error {
	return adminapi.NewProblem(http.StatusUnprocessableEntity, adminapi.CodeInvalidRequest, "Invalid request", fmt.Sprintf(format, args...))
}

func conflict(code, detail string, current any) error {
	p := adminapi.NewProblem(http.StatusConflict, code, "Conflict", detail)
	p.Current = current
	return p
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return adminapi.NewProblem(http.StatusRequestEntityTooLarge, adminapi.CodeInvalidRequest, "Request too large", fmt.Sprintf("bodies are limited to %d bytes", maxBody))
		}
		// The decoder's message can quote the body, which may carry a secret: name only the kind.
		return invalid("the body is not the expected JSON object")
	}
	return nil
}

func scriptName(r *http.Request) (string, error) {
	name := r.PathValue("scriptName")
	if !scriptNamePattern.MatchString(name) {
		return "", invalid("script name %q does not match %s", name, scriptNamePattern)
	}
	return name, nil
}

func hostname(r *http.Request) (string, error) {
	h := r.PathValue("hostname")
	if len(h) > 253 || !hostnamePattern.MatchString(h) {
		return "", invalid("hostname %q must be a lowercase DNS name without a port", h)
	}
	return h, nil
}

func checkID(field, v string) error {
	if !idPattern.MatchString(v) {
		return invalid("%s %q must match %s", field, v, idPattern)
	}
	return nil
}

// replayLocked recognises an effect id (n.mu held): a replay of the same request answers true; the
// same id on another target or with another request is a conflict.
func (n *Node) replayLocked(effectID, target, requestMAC string) (bool, error) {
	e, ok := n.desired.Effects[effectID]
	if !ok {
		return false, nil
	}
	if e.Target == target && e.RequestMAC == requestMAC {
		return true, nil
	}
	return false, conflict(adminapi.CodeEffectConflict, fmt.Sprintf("effect %s was already applied with another request", effectID), nil)
}

// recordLocked remembers an applied effect (n.mu held), forgetting the oldest beyond the bound.
func (n *Node) recordLocked(effectID, target, requestMAC string) {
	n.desired.Effects[effectID] = state.EffectEntry{Target: target, RequestMAC: requestMAC, At: time.Now().UTC()}
	if len(n.desired.Effects) <= maxEffects {
		return
	}
	ids := make([]string, 0, len(n.desired.Effects))
	for id := range n.desired.Effects {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return n.desired.Effects[ids[i]].At.Before(n.desired.Effects[ids[j]].At) })
	for _, id := range ids[:len(ids)-maxEffects] {
		delete(n.desired.Effects, id)
	}
}

// requestMAC is a keyed digest of a request body: effect replays are recognised without keeping a
// reusable digest of any secret the body carries.
func (n *Node) requestMAC(v any) string {
	b, _ := json.Marshal(v)
	return n.store.MAC(b)
}

// saveLocked persists the desired state; on failure it restores the previous copy so memory never
// runs ahead of disk.
func (n *Node) saveLocked(previous *state.Desired) error {
	if err := n.store.Save(n.desired); err != nil {
		n.desired = previous
		return fmt.Errorf("persist desired state: %w", err)
	}
	return nil
}

// snapshotLocked deep-copies the desired state (through JSON: it is small, and exactness matters
// more than speed here).
func (n *Node) snapshotLocked() *state.Desired {
	b, err := json.Marshal(n.desired)
	if err != nil {
		panic(err)
	}
	var d state.Desired
	if err := json.Unmarshal(b, &d); err != nil {
		panic(err)
	}
	return &d
}

func replayed(w http.ResponseWriter) { w.Header().Set(adminapi.HeaderReplayed, "true") }

func (n *Node) putScript(w http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.ScriptPut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := validateScript(req); err != nil {
		return nil, err
	}
	mac := n.requestMAC(req)
	target := "script:" + name
	n.mu.Lock()
	defer n.mu.Unlock()
	if again, err := n.replayLocked(req.EffectID, target, mac); err != nil || again {
		if again {
			replayed(w)
			return n.scriptStatusLocked(name), nil
		}
		return nil, err
	}
	cur := n.desired.Scripts[name]
	if cur != nil && cur.WorkerUID != req.WorkerUID {
		// A script is one worker's (SPEC 3.4): no generation, clock or retry order moves it to
		// another worker UID. It is free again only once its holder's delete is confirmed. The
		// answer names nobody: the holder may be another organization's.
		return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeScriptHeld, "Script held",
			fmt.Sprintf("script %s is held by another worker; it is free once that worker's delete is confirmed", name))
	}
	if floor := n.desired.Floors[name]; cur == nil && req.Generation <= floor {
		// A late copy from a worker this script name has moved past (deleted): it never revives
		// a deleted script.
		return nil, conflict(adminapi.CodeStaleGeneration, fmt.Sprintf("script %s has moved past generation %d (to %d)", name, req.Generation, floor), n.scriptStatusLocked(name))
	}
	next := &state.Script{
		Name: name, WorkerUID: req.WorkerUID, DeploymentID: req.DeploymentID, Generation: req.Generation, Labels: req.Labels,
		Modules: req.Modules, MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings.Normalize(),
		SecretNames: slices.Sorted(slices.Values(req.SecretNames)), BundleDigest: req.BundleDigest,
	}
	var erase string
	if cur != nil && cur.WorkerUID == req.WorkerUID {
		// Generations only move forward for one worker UID: a late copy of an older PUT can
		// never revert a newer deployment.
		if req.Generation < cur.Generation {
			return nil, conflict(adminapi.CodeStaleGeneration, fmt.Sprintf("script %s is at generation %d; %d is older", name, cur.Generation, req.Generation), n.scriptStatusLocked(name))
		}
		if req.Generation == cur.Generation && !sameDeployment(cur, next) {
			return nil, conflict(adminapi.CodeGenerationConflict, fmt.Sprintf("generation %d of script %s was already deployed with other content", req.Generation, name), n.scriptStatusLocked(name))
		}
		next.Delivery, next.Admitted, next.Serving = cur.Delivery, cur.Admitted, cur.Serving
	}
	if len(next.SecretNames) == 0 && next.Delivery != nil {
		// A worker that declares no secrets keeps no values here (SPEC 3.5).
		erase, next.Delivery = next.Delivery.WorkerUID, nil
	}
	previous := n.snapshotLocked()
	n.desired.Scripts[name] = next
	n.recordLocked(req.EffectID, target, mac)
	if err := n.saveLocked(previous); err != nil {
		return nil, err
	}
	n.eraseSecrets(erase)
	if run := n.scripts[name]; run != nil {
		run.failed = nil // a new effect asks again for a candidate that failed
	}
	n.reconcileLocked(name)
	n.log.Info("script desired", "script", name, "workerUid", req.WorkerUID, "deploymentId", req.DeploymentID, "generation", req.Generation, "effectId", req.EffectID)
	return n.scriptStatusLocked(name), nil
}

func (n *Node) eraseSecrets(workerUID string) {
	if workerUID == "" {
		return
	}
	if err := n.store.EraseSecrets(workerUID); err != nil {
		n.log.Error("erase delivered secrets", "workerUid", workerUID, "error", err)
	}
}

func sameDeployment(a, b *state.Script) bool {
	return a.DeploymentID == b.DeploymentID && a.Labels == b.Labels && a.MainModule == b.MainModule &&
		a.CompatibilityDate == b.CompatibilityDate && a.BundleDigest == b.BundleDigest && a.Settings.Equal(b.Settings) &&
		slices.Equal(a.SecretNames, b.SecretNames) && mapsEqual(a.Modules, b.Modules)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func validateScript(req adminapi.ScriptPut) error {
	if err := checkID("effectId", req.EffectID); err != nil {
		return err
	}
	if !state.ValidWorkerUID(req.WorkerUID) {
		return invalid("workerUid %q must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", req.WorkerUID)
	}
	if err := checkID("deploymentId", req.DeploymentID); err != nil {
		return err
	}
	if req.Generation < 1 {
		return invalid("generation must be at least 1")
	}
	seen := map[string]bool{}
	for _, s := range req.SecretNames {
		if seen[s] {
			return invalid("secretNames names %q twice", s)
		}
		seen[s] = true
	}
	if err := (workerd.Worker{Modules: req.Modules, MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings.Normalize(), Secrets: req.SecretNames}).Validate(); err != nil {
		return invalid("%v", err)
	}
	return nil
}

func (n *Node) getScript(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.scriptStatusLocked(name), nil
}

// deleteScript removes a script only while it belongs to the worker UID the caller names; it waits
// for the script's incarnations to stop, so the answer is the truth about absence.
func (n *Node) deleteScript(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	uid := r.URL.Query().Get(adminapi.QueryWorkerUID)
	if uid == "" {
		return nil, invalid("the delete names the worker UID it means: ?workerUid=")
	}
	n.mu.Lock()
	cur := n.desired.Scripts[name]
	if cur == nil || cur.WorkerUID != uid {
		// Absent, or another worker UID's (a successor): nothing of the caller's is here.
		defer n.mu.Unlock()
		return n.scriptStatusLocked(name), nil
	}
	previous := n.snapshotLocked()
	delete(n.desired.Scripts, name)
	if n.desired.Floors == nil {
		n.desired.Floors = map[string]int64{}
	}
	if cur.Generation > n.desired.Floors[name] {
		n.desired.Floors[name] = cur.Generation
	}
	if err := n.saveLocked(previous); err != nil {
		n.mu.Unlock()
		return nil, err
	}
	if cur.Delivery != nil {
		n.eraseSecrets(cur.Delivery.WorkerUID)
	}
	// The worker's log goes with it: a later worker of this script name (another UID) starts with
	// its own.
	n.dropLogRingLocked(uid)
	retired := n.reconcileLocked(name)
	n.mu.Unlock()
	for _, inc := range retired {
		<-inc.Done()
	}
	n.log.Info("script deleted", "script", name, "workerUid", uid)
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.scriptStatusLocked(name), nil
}

func (n *Node) putSecrets(w http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.SecretsPut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := checkID("effectId", req.EffectID); err != nil {
		return nil, err
	}
	if err := checkID("deliveryId", req.DeliveryID); err != nil {
		return nil, err
	}
	if !state.ValidWorkerUID(req.WorkerUID) {
		return nil, invalid("workerUid %q must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", req.WorkerUID)
	}
	names := make([]string, 0, len(req.Values))
	for k := range req.Values {
		if !workerd.ValidBindingName(k) {
			return nil, invalid("binding name %q does not match ^[A-Za-z_][A-Za-z0-9_]*$", k)
		}
		names = append(names, k)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return nil, invalid("a delivery carries at least one value")
	}
	mac := n.requestMAC(req)
	target := "secrets:" + name
	n.mu.Lock()
	defer n.mu.Unlock()
	if again, err := n.replayLocked(req.EffectID, target, mac); err != nil || again {
		if again {
			replayed(w)
			return n.scriptStatusLocked(name), nil
		}
		return nil, err
	}
	if _, refused := n.desired.Refused[req.DeliveryID]; refused {
		return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeDeliveryRefused, "Delivery refused",
			fmt.Sprintf("delivery %s was concluded absent by a readback; it never lands now", req.DeliveryID))
	}
	cur := n.desired.Scripts[name]
	if cur == nil {
		return nil, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeScriptAbsent, "Not Found", fmt.Sprintf("script %s is not here; PUT it first", name))
	}
	if cur.WorkerUID != req.WorkerUID {
		return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeWorkerMismatch, "Worker mismatch",
			fmt.Sprintf("script %s belongs to another worker; a delivery is for the worker holding the script", name))
	}
	if !slices.Equal(names, cur.SecretNames) {
		return nil, adminapi.NewProblem(http.StatusUnprocessableEntity, adminapi.CodeSecretNames, "Secret names mismatch",
			fmt.Sprintf("the delivery names %v; script %s declares %v", names, name, cur.SecretNames))
	}
	if err := n.store.SealSecrets(req.WorkerUID, req.DeliveryID, req.Values); err != nil {
		return nil, err
	}
	previous := n.snapshotLocked()
	cur.Delivery = &state.Delivery{DeliveryID: req.DeliveryID, WorkerUID: req.WorkerUID, Names: names, ValuesMAC: n.store.ValuesMAC(req.Values)}
	n.recordLocked(req.EffectID, target, mac)
	if err := n.saveLocked(previous); err != nil {
		return nil, err
	}
	if run := n.scripts[name]; run != nil {
		run.failed = nil
	}
	// The new delivery is a new incarnation, admitted through the update path.
	n.reconcileLocked(name)
	n.log.Info("secrets delivered", "script", name, "workerUid", req.WorkerUID, "deliveryId", req.DeliveryID, "names", names, "effectId", req.EffectID)
	return n.scriptStatusLocked(name), nil
}

func (n *Node) deleteSecrets(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	uid := r.URL.Query().Get(adminapi.QueryWorkerUID)
	if uid == "" {
		return nil, invalid("the delete names the worker UID it means: ?workerUid=")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.desired.Scripts[name]
	if cur == nil || cur.WorkerUID != uid || cur.Delivery == nil {
		return n.scriptStatusLocked(name), nil
	}
	previous := n.snapshotLocked()
	cur.Delivery = nil
	if err := n.saveLocked(previous); err != nil {
		return nil, err
	}
	n.eraseSecrets(uid)
	n.reconcileLocked(name)
	n.log.Info("secrets erased", "script", name, "workerUid", uid)
	return n.scriptStatusLocked(name), nil
}

// readback answers HMAC-SHA256(challenge, canonical JSON of the bindings exactly as given to
// workerd): the Host compares it with the digest it stored at sealing (SPEC 3.5). No value and no
// unkeyed digest leaves.
func (n *Node) readback(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.ReadbackRequest
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	challenge, err := base64.StdEncoding.DecodeString(req.Challenge)
	if err != nil || len(challenge) != 32 {
		return nil, invalid("challenge must be standard base64 of 32 bytes")
	}
	if req.Concludes != "" {
		if err := checkID("concludes", req.Concludes); err != nil {
			return nil, err
		}
		n.mu.Lock()
		defer n.mu.Unlock()
		if err := n.refuseUnlessHeldLocked(name, req.Concludes); err != nil {
			return nil, err
		}
	} else {
		n.mu.RLock()
		defer n.mu.RUnlock()
	}
	cur := n.desired.Scripts[name]
	if cur == nil || cur.Delivery == nil {
		out := adminapi.Readback{}
		if cur != nil {
			out.WorkerUID = cur.WorkerUID
		}
		return out, nil
	}
	values, err := n.store.OpenSecrets(cur.Delivery.WorkerUID, cur.Delivery.DeliveryID)
	if err != nil {
		return nil, err
	}
	h := hmac.New(sha256.New, challenge)
	h.Write(canonjson.Marshal(state.Reveal(values)))
	return adminapi.Readback{Present: true, WorkerUID: cur.WorkerUID, DeliveryID: cur.Delivery.DeliveryID, Digest: hex.EncodeToString(h.Sum(nil))}, nil
}

// RefusedFor is how long a delivery a readback concluded absent stays refused: far longer than
// any request to the runtime can be on its way.
const RefusedFor = 24 * time.Hour

// refuseUnlessHeldLocked records delivery as refused when script name does not hold it (n.mu
// held for writing), and forgets refusals older than RefusedFor.
func (n *Node) refuseUnlessHeldLocked(name, delivery string) error {
	if cur := n.desired.Scripts[name]; cur != nil && cur.Delivery != nil && cur.Delivery.DeliveryID == delivery {
		return nil
	}
	if _, ok := n.desired.Refused[delivery]; ok {
		return nil
	}
	previous := n.snapshotLocked()
	now := time.Now()
	for id, at := range n.desired.Refused {
		if now.Sub(at) > RefusedFor {
			delete(n.desired.Refused, id)
		}
	}
	if n.desired.Refused == nil {
		n.desired.Refused = map[string]time.Time{}
	}
	n.desired.Refused[delivery] = now
	if err := n.saveLocked(previous); err != nil {
		return err
	}
	n.log.Info("delivery refused: a readback concluded it absent", "script", name, "deliveryId", delivery)
	return nil
}

func (n *Node) putRoute(w http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.RoutePut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := checkID("effectId", req.EffectID); err != nil {
		return nil, err
	}
	if !scriptNamePattern.MatchString(req.ScriptName) {
		return nil, invalid("scriptName %q does not match %s", req.ScriptName, scriptNamePattern)
	}
	if err := checkID("endpointUid", req.EndpointUID); err != nil {
		return nil, err
	}
	if err := checkID("deploymentId", req.DeploymentID); err != nil {
		return nil, err
	}
	mac := n.requestMAC(req)
	target := "route:" + host
	n.mu.Lock()
	defer n.mu.Unlock()
	if again, err := n.replayLocked(req.EffectID, target, mac); err != nil || again {
		if again {
			replayed(w)
			return n.routeStatusLocked(host), nil
		}
		return nil, err
	}
	if cur := n.desired.Routes[host]; cur != nil && cur.EndpointUID != req.EndpointUID {
		// One endpoint per hostname: its holder leaves through its own (compare-and-)delete.
		return nil, conflict(adminapi.CodeRouteConflict, fmt.Sprintf("hostname %s is routed for another endpoint", host), n.routeStatusLocked(host))
	}
	previous := n.snapshotLocked()
	n.desired.Routes[host] = &state.Route{Hostname: host, ScriptName: req.ScriptName, EndpointUID: req.EndpointUID, DeploymentID: req.DeploymentID}
	n.recordLocked(req.EffectID, target, mac)
	if err := n.saveLocked(previous); err != nil {
		return nil, err
	}
	n.log.Info("route installed", "hostname", host, "script", req.ScriptName, "endpointUid", req.EndpointUID, "effectId", req.EffectID)
	return n.routeStatusLocked(host), nil
}

func (n *Node) getRoute(_ http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.routeStatusLocked(host), nil
}

// deleteRoute is compare-and-delete (SPEC 5): only a route that still maps the hostname to that
// script for that endpoint UID is removed, so a late delete never removes its successor. The answer
// is what is there afterwards.
func (n *Node) deleteRoute(_ http.ResponseWriter, r *http.Request) (any, error) {
	host, err := hostname(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	script, endpoint := q.Get(adminapi.QueryScriptName), q.Get(adminapi.QueryEndpointUID)
	if script == "" || endpoint == "" {
		return nil, invalid("the delete names what it means: ?scriptName=&endpointUid=")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	cur := n.desired.Routes[host]
	if cur != nil && cur.ScriptName == script && cur.EndpointUID == endpoint {
		previous := n.snapshotLocked()
		delete(n.desired.Routes, host)
		if err := n.saveLocked(previous); err != nil {
			return nil, err
		}
		n.log.Info("route removed", "hostname", host, "script", script, "endpointUid", endpoint)
	}
	return n.routeStatusLocked(host), nil
}

func (n *Node) status(_ http.ResponseWriter, _ *http.Request) (any, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	out := adminapi.Status{Scripts: []adminapi.ScriptStatus{}, Routes: []adminapi.RouteStatus{}, Brakes: n.brakesLocked(), Sandbox: n.sandboxMode()}
	for _, name := range sortedKeys(n.desired.Scripts) {
		out.Scripts = append(out.Scripts, n.scriptStatusLocked(name))
	}
	for _, host := range sortedKeys(n.desired.Routes) {
		out.Routes = append(out.Routes, n.routeStatusLocked(host))
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func (n *Node) brakesLocked() adminapi.Brakes {
	return adminapi.Brakes{Lifecycle: append([]adminapi.BrakeScope{}, n.desired.Brakes...)}
}

func (n *Node) getBrakes(_ http.ResponseWriter, _ *http.Request) (any, error) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.brakesLocked(), nil
}

// setLifecycleBrake engages or releases the brake of exactly one scope. Releasing wakes every
// held restart, which then checks the remaining brakes.
func (n *Node) setLifecycleBrake(_ http.ResponseWriter, r *http.Request) (any, error) {
	var req adminapi.BrakeSet
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if !req.Scope.Valid() {
		return nil, invalid("a brake scope is global, an organization, or an organization's space and worker")
	}
	n.mu.Lock()
	previous := n.snapshotLocked()
	brakes := slices.DeleteFunc(n.desired.Brakes, func(b adminapi.BrakeScope) bool { return b == req.Scope })
	if req.Engaged {
		brakes = append(brakes, req.Scope)
	}
	n.desired.Brakes = brakes
	if err := n.saveLocked(previous); err != nil {
		n.mu.Unlock()
		return nil, err
	}
	var wake []*supervisor.Incarnation
	for _, run := range n.scripts {
		wake = append(wake, run.incarnations()...)
	}
	out := n.brakesLocked()
	n.mu.Unlock()
	for _, inc := range wake {
		inc.Wake()
	}
	n.log.Info("lifecycle brake", "engaged", req.Engaged, "scope", scopeText(req.Scope))
	return out, nil
}

func scopeText(s adminapi.BrakeScope) string {
	parts := []string{}
	for _, p := range []struct{ k, v string }{{"org", s.Organization}, {"space", s.Space}, {"worker", s.Worker}} {
		if p.v != "" {
			parts = append(parts, p.k+"="+p.v)
		}
	}
	if len(parts) == 0 {
		return "global"
	}
	return strings.Join(parts, " ")
}
