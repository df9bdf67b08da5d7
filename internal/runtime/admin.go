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
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/supervisor"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

const (
	maxBody = 32 << 20 // a bundle's modules travel in one script PUT
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

// applyLocked decides op on the desired state (n.mu held for writing), persists the state it
// returns (so memory never runs ahead of disk), then performs the side effects its answer asks for.
// A refusal is a problem carrying, where the refusal allows it, the current status of subject (the
// script name or hostname of the request). seal, when the answer asks for it, puts the operation's
// values at rest before the state names them. The incarnations the reconcile retired finish
// stopping in the background; the caller may wait for them.
func (n *Node) applyLocked(op desired.Op, subject string, seal func() error) (desired.Answer, []*supervisor.Incarnation, error) {
	next, a := desired.Apply(*n.desired, op)
	if a.Refused != nil {
		return a, nil, n.refusalLocked(a.Refused, subject)
	}
	if !a.Changed {
		return a, nil, nil
	}
	if a.Seal {
		if err := seal(); err != nil {
			return a, nil, err
		}
	}
	if err := n.store.Save(&next); err != nil {
		return a, nil, fmt.Errorf("persist desired state: %w", err)
	}
	n.desired = &next
	n.eraseSecrets(a.Erase)
	if a.DropLog != "" {
		n.dropLogRingLocked(a.DropLog)
	}
	if run := n.scripts[a.Reconcile]; a.RetryFailed && run != nil {
		run.failed = nil // a new effect asks again for a candidate that failed
	}
	var retired []*supervisor.Incarnation
	if a.Reconcile != "" {
		retired = n.reconcileLocked(a.Reconcile)
	}
	if a.WakeAll {
		for _, run := range n.scripts {
			for _, inc := range run.incarnations() {
				inc.Wake()
			}
		}
	}
	return a, retired, nil
}

// refusalLocked is the problem answering a refusal: the one place its codes meet HTTP statuses.
func (n *Node) refusalLocked(r *desired.Refusal, subject string) error {
	status, title := http.StatusConflict, "Conflict"
	switch r.Code {
	case adminapi.CodeScriptHeld:
		title = "Script held"
	case adminapi.CodeDeliveryRefused:
		title = "Delivery refused"
	case adminapi.CodeWorkerMismatch:
		title = "Worker mismatch"
	case adminapi.CodeScriptAbsent:
		status, title = http.StatusNotFound, "Not Found"
	case adminapi.CodeSecretNames:
		status, title = http.StatusUnprocessableEntity, "Secret names mismatch"
	}
	p := adminapi.NewProblem(status, r.Code, title, r.Detail)
	switch r.Shows {
	case desired.ShowsScript:
		p.Current = n.scriptStatusLocked(subject)
	case desired.ShowsRoute:
		p.Current = n.routeStatusLocked(subject)
	}
	return p
}

// effect names one request's effect for Apply: its id, the keyed digest of its body, and now.
func (n *Node) effect(id string, body any) desired.Effect {
	b, _ := json.Marshal(body)
	return desired.Effect{ID: id, RequestMAC: n.store.MAC(b), At: time.Now().UTC()}
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
	op := desired.PutScript{Effect: n.effect(req.EffectID, req), Script: state.Script{
		Name: name, WorkerUID: req.WorkerUID, DeploymentID: req.DeploymentID, Generation: req.Generation, Labels: req.Labels,
		Modules: req.Modules, MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings.Normalize(),
		SecretNames: slices.Sorted(slices.Values(req.SecretNames)), BundleDigest: req.BundleDigest,
	}}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(op, name, nil)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("script desired", "script", name, "workerUid", req.WorkerUID, "deploymentId", req.DeploymentID, "generation", req.Generation, "effectId", req.EffectID)
	}
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
	a, retired, err := n.applyLocked(desired.DeleteScript{Name: name, WorkerUID: uid}, name, nil)
	n.mu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, inc := range retired {
		<-inc.Done()
	}
	if a.Changed {
		n.log.Info("script deleted", "script", name, "workerUid", uid)
	}
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
	op := desired.PutSecrets{Effect: n.effect(req.EffectID, req), Name: name,
		Delivery: state.Delivery{DeliveryID: req.DeliveryID, WorkerUID: req.WorkerUID, Names: names, ValuesMAC: n.store.ValuesMAC(req.Values)}}
	seal := func() error { return n.store.SealSecrets(req.WorkerUID, req.DeliveryID, req.Values) }
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(op, name, seal)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("secrets delivered", "script", name, "workerUid", req.WorkerUID, "deliveryId", req.DeliveryID, "names", names, "effectId", req.EffectID)
	}
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
	a, _, err := n.applyLocked(desired.DeleteSecrets{Name: name, WorkerUID: uid}, name, nil)
	if err != nil {
		return nil, err
	}
	if a.Changed {
		n.log.Info("secrets erased", "script", name, "workerUid", uid)
	}
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
		a, _, err := n.applyLocked(desired.ConcludeAbsent{Name: name, DeliveryID: req.Concludes, At: time.Now()}, name, nil)
		if err != nil {
			return nil, err
		}
		if a.Changed {
			n.log.Info("delivery refused: a readback concluded it absent", "script", name, "deliveryId", req.Concludes)
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
	op := desired.PutRoute{Effect: n.effect(req.EffectID, req),
		Route: state.Route{Hostname: host, ScriptName: req.ScriptName, EndpointUID: req.EndpointUID, DeploymentID: req.DeploymentID}}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(op, host, nil)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("route installed", "hostname", host, "script", req.ScriptName, "endpointUid", req.EndpointUID, "effectId", req.EffectID)
	}
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

// deleteRoute is compare-and-delete (SPEC 5; desired.DeleteRoute). The answer is what is there
// afterwards.
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
	a, _, err := n.applyLocked(desired.DeleteRoute{Hostname: host, ScriptName: script, EndpointUID: endpoint}, host, nil)
	if err != nil {
		return nil, err
	}
	if a.Changed {
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

// setLifecycleBrake engages or releases the brake of exactly one scope (desired.SetBrake).
func (n *Node) setLifecycleBrake(_ http.ResponseWriter, r *http.Request) (any, error) {
	var req adminapi.BrakeSet
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if !req.Scope.Valid() {
		return nil, invalid("a brake scope is global, an organization, or an organization's space and worker")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, _, err := n.applyLocked(desired.SetBrake{Scope: req.Scope, Engaged: req.Engaged}, "", nil); err != nil {
		return nil, err
	}
	n.log.Info("lifecycle brake", "engaged", req.Engaged, "scope", scopeText(req.Scope))
	return n.brakesLocked(), nil
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
