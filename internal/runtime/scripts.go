package runtime

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/supervisor"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// scriptRun is what runs for one script: the serving incarnation (admitted; the edge sends its
// requests there), a candidate being admitted beside it, and the last candidate that failed.
type scriptRun struct {
	serving   *running
	candidate *running
	failed    *running
	// problem explains why no candidate could even be built (a delivery that does not open).
	problem string
	// unstartable is the identity whose candidate could not be started, tried again only from
	// retryAt on (or when the Host asks again), the wait doubling up to maxStartBackoff: a script
	// that cannot start must not cost the node a start, and its log a line, on every nudge.
	unstartable string
	retryAt     time.Time
	backoff     time.Duration
	// workerUID is the worker UID the script's entry of n.byUID was made for.
	workerUID string
	// want is the identity of the desired script it was computed for: rendering a config and
	// digesting a bundle costs about 20 ns a byte, and reconciles and status reads ask for it far
	// more often than the desired script changes. Written only with n.mu held for writing.
	want wanted
	// reconciles and renders count the work this script cost the node (tests read them).
	reconciles int
	renders    atomic.Int64
}

// wanted is a desired script's identity, for that script value (the desired state is copied on
// write: a changed script is a new value) and that generation of the deny list.
type wanted struct {
	of      *state.Script
	denyGen uint64
	id      desiredIdentity
	err     error
}

// wantLocked is the identity s should run as (n.mu held). With n.mu held for writing it keeps what
// it computed; a reader (holding it for reading) only uses what is kept, which every reconcile of
// a changed script has just computed.
func (n *Node) wantLocked(r *scriptRun, s *state.Script, writing bool) (desiredIdentity, error) {
	if r.want.of == s && r.want.denyGen == n.denyGen {
		return r.want.id, r.want.err
	}
	r.renders.Add(1)
	id, err := identity(s, n.deny)
	if writing {
		r.want = wanted{of: s, denyGen: n.denyGen, id: id, err: err}
	}
	return id, err
}

// running is one incarnation and the deployment it was started for.
type running struct {
	inc *supervisor.Incarnation
	desiredIdentity
}

func (r *scriptRun) incarnations() []*supervisor.Incarnation {
	var out []*supervisor.Incarnation
	for _, x := range []*running{r.serving, r.candidate} {
		if x != nil {
			out = append(out, x.inc)
		}
	}
	return out
}

// desiredIdentity is a desired deployment's incarnation identity and what it reports.
type desiredIdentity struct {
	id           string
	deploymentID string
	generation   int64
	deliveryID   string
	secretNames  []string
	config       map[string][]byte
}

// identity derives the incarnation a script's desired state calls for. The identity is the exact
// bundle digest and config digest; the config names the secret bindings, and the values enter by
// their keyed digest (HMAC under the runtime's key, never a plain hash). A new deployment with the
// same code, config and secrets is the same incarnation, which simply keeps serving.
func identity(s *state.Script, deny []string) (desiredIdentity, error) {
	var names []string
	var valuesMAC, deliveryID string
	if s.Delivery != nil {
		names = append(names, s.Delivery.Names...)
		valuesMAC, deliveryID = s.Delivery.ValuesMAC, s.Delivery.DeliveryID
	}
	sort.Strings(names)
	files, err := workerd.Render(workerd.Worker{Modules: s.Modules, MainModule: s.MainModule, CompatibilityDate: s.CompatibilityDate, Settings: s.Settings, Secrets: names, Deny: deny},
		supervisor.ConfigFile, supervisor.ConfigConst, supervisor.SocketName)
	if err != nil {
		return desiredIdentity{}, err
	}
	modules := make(map[string]string, len(s.Modules))
	for k, v := range s.Modules {
		modules[k] = v
	}
	bundle := sha256.Sum256(canonjson.Marshal(canonjson.Object{{Key: "mainModule", Value: s.MainModule}, {Key: "modules", Value: modules}}))
	configFields := canonjson.Object{
		{Key: "script", Value: s.Name},
		{Key: "config", Value: string(files[supervisor.ConfigFile])},
		{Key: "secretsMac", Value: valuesMAC},
	}
	if mb := s.Settings.LimitsOrZero().MemoryMB; mb > 0 {
		// A memory ceiling is the process's cgroup: another one is another incarnation. Only a
		// script with one digests it, so that every other keeps its identity.
		configFields = append(configFields, canonjson.Field{Key: "memoryMb", Value: mb})
	}
	config := sha256.Sum256(canonjson.Marshal(configFields))
	id := sha256.Sum256(canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: "takoform.runtime-incarnation.v1"},
		{Key: "bundle", Value: hex.EncodeToString(bundle[:])},
		{Key: "config", Value: hex.EncodeToString(config[:])},
	}))
	return desiredIdentity{
		id: "inc-" + hex.EncodeToString(id[:])[:32], deploymentID: s.DeploymentID, generation: s.Generation,
		deliveryID: deliveryID, secretNames: names, config: files,
	}, nil
}

// Waits before a candidate that could not be started is tried again.
const (
	minStartBackoff = time.Second
	maxStartBackoff = time.Minute
)

// nextStartBackoff is the wait after a failed start: minStartBackoff after the first failure of an
// identity, then twice the last wait, capped at maxStartBackoff.
func nextStartBackoff(last time.Duration, again bool) time.Duration {
	if !again || last <= 0 {
		return minStartBackoff
	}
	return min(2*last, maxStartBackoff)
}

// reconcileLocked moves one script towards its desired state (n.mu held):
//   - the serving incarnation already is the desired one: it serves the new deployment, and any
//     other candidate stops;
//   - otherwise a candidate for the desired identity starts beside it, and once Ready it becomes the
//     serving one (the edge switches), is admitted (continuity now keeps exactly it alive), and the
//     previous one drains and stops;
//   - a failed candidate stays failed (the incumbent keeps serving) until the Host asks again;
//   - a candidate that could not even be started is tried again after a capped backoff, or at
//     once when the Host asks again.
//
// It returns the incarnations it retired, which finish stopping in the background.
func (n *Node) reconcileLocked(name string) []*supervisor.Incarnation {
	if n.closing {
		return nil
	}
	s := n.desired.Scripts[name]
	r := n.scripts[name]
	if r == nil {
		r = &scriptRun{}
		n.scripts[name] = r
	}
	r.reconciles++
	n.indexLocked(name, r, s)
	var retired []*supervisor.Incarnation
	retire := func(x *running, drain bool) {
		if x != nil {
			retired = append(retired, x.inc)
			n.retire(x.inc, drain)
		}
	}
	if s == nil {
		retire(r.candidate, false)
		retire(r.serving, true)
		delete(n.scripts, name)
		// A deleted script's earlier incumbents still draining are retired too: the delete's
		// answer waits for every process of the script.
		for inc := range n.stopping[name] {
			if !slices.Contains(retired, inc) {
				retired = append(retired, inc)
			}
		}
		return retired
	}
	want, err := n.wantLocked(r, s, true)
	if err != nil {
		r.problem = "the desired deployment cannot be rendered: " + err.Error()
		return nil
	}
	r.problem = ""
	if r.serving != nil && r.serving.id == want.id {
		r.serving.desiredIdentity = want
		// A new limit (or a binding to another callee) is the same incarnation: it takes effect
		// in place.
		r.serving.inc.SetWallLimit(wallLimit(s))
		r.serving.inc.SetCallees(s.Settings.ServiceBindings)
		retire(r.candidate, false)
		r.candidate, r.failed = nil, nil
		return retired
	}
	if r.candidate != nil && r.candidate.id != want.id {
		retire(r.candidate, false)
		r.candidate = nil
	}
	if r.candidate == nil {
		if r.failed != nil && r.failed.id == want.id {
			return retired
		}
		if r.unstartable == want.id && time.Now().Before(r.retryAt) {
			return retired
		}
		c, err := n.startCandidate(s, want)
		if err != nil {
			r.problem = err.Error()
			r.backoff = nextStartBackoff(r.backoff, r.unstartable == want.id)
			r.unstartable, r.retryAt = want.id, time.Now().Add(r.backoff)
			time.AfterFunc(r.backoff, func() { n.nudge(name) })
			n.log.Error("start candidate", "script", name, "error", err, "retryIn", r.backoff.String())
			return retired
		}
		r.candidate, r.failed = c, nil
		r.unstartable, r.backoff = "", 0
	}
	// The candidate is the desired identity: a binding to another callee since it started is
	// taken in place (the serving incarnation keeps its own until the candidate replaces it).
	r.candidate.inc.SetCallees(s.Settings.ServiceBindings)
	switch c := r.candidate; {
	case c.inc.Ready() && r.serving != nil && !secretsCover(s):
		// Held: the new code declares secrets its delivery does not carry yet, and the edge never
		// switches to a revision without them; the incumbent serves until they arrive (SPEC 3.5).
	case c.inc.Ready():
		// Promotion: the edge sends new requests to the candidate from here on.
		old := r.serving
		r.serving, r.candidate = c, nil
		c.inc.Admit()
		if next, a := desired.Apply(*n.desired, desired.Admit{Name: name, Incarnation: c.id, DeliveryID: c.deliveryID}); a.Changed {
			// It serves whether or not the disk took it: memory goes ahead, and a restarted node
			// merely treats it as a candidate again.
			n.desired = &next
			// Admitting records what serves; what the script should run, its identity, stands.
			if r.want.of == s {
				r.want.of = n.desired.Scripts[name]
			}
			if err := n.store.Save(n.desired); err != nil {
				n.log.Error("persist the admitted incarnation", "script", name, "error", err)
			}
		}
		n.log.Info("incarnation serving", "script", name, "incarnation", c.id, "deploymentId", c.deploymentID, "generation", c.generation)
		retire(old, true)
	case isDone(c.inc) || c.inc.Status().State == adminapi.StateFailed:
		r.failed, r.candidate = c, nil
	}
	return retired
}

// resumeServingLocked, at start-up, starts again the incarnation a script had admitted when a
// newer deployment has replaced its desired content since (that one never served, or failed): the
// incumbent serves again at once, and the newer one is then only a candidate beside it, as before
// the restart. An incumbent whose values were replaced by a newer delivery cannot run again.
func (n *Node) resumeServingLocked(name string) {
	s := n.desired.Scripts[name]
	if s == nil || s.Serving == nil || s.Admitted == "" {
		return
	}
	if want, err := identity(s, n.deny); err != nil || want.id == s.Admitted {
		return // the desired content is the admitted incarnation: reconcile starts it
	}
	old := *s
	old.DeploymentID, old.Generation = s.Serving.DeploymentID, s.Serving.Generation
	old.Modules, old.MainModule, old.CompatibilityDate = s.Serving.Modules, s.Serving.MainModule, s.Serving.CompatibilityDate
	old.Settings = s.Serving.Settings
	switch {
	case s.Serving.DeliveryID == "":
		old.Delivery = nil
	case s.Delivery == nil || s.Delivery.DeliveryID != s.Serving.DeliveryID:
		return
	}
	id, err := identity(&old, n.deny)
	if err != nil || id.id != s.Admitted {
		return
	}
	r, err := n.startCandidate(&old, id)
	if err != nil {
		n.log.Error("start the admitted incarnation again", "script", name, "error", err)
		return
	}
	n.scripts[name] = &scriptRun{serving: r}
	n.log.Info("incarnation serving again after a restart", "script", name, "incarnation", id.id, "generation", id.generation)
}

func isDone(inc *supervisor.Incarnation) bool {
	select {
	case <-inc.Done():
		return true
	default:
		return false
	}
}

// retire stops an incarnation in the background: drained (its requests in flight finish, bounded)
// when it has served, at once when it never did.
// Until it has stopped it stays in the script's stopping set, so that a delete of the script
// waits for it too (n.mu held).
func (n *Node) retire(inc *supervisor.Incarnation, drain bool) {
	n.retiring.Add(1)
	if n.stopping[inc.Script()] == nil {
		n.stopping[inc.Script()] = map[*supervisor.Incarnation]bool{}
	}
	n.stopping[inc.Script()][inc] = true
	go func() {
		defer n.retiring.Done()
		defer func() {
			n.mu.Lock()
			delete(n.stopping[inc.Script()], inc)
			if len(n.stopping[inc.Script()]) == 0 {
				delete(n.stopping, inc.Script())
			}
			n.mu.Unlock()
		}()
		if drain {
			inc.Drain(n.cfg.DrainTimeout)
		} else {
			inc.Stop()
		}
		n.log.Info("incarnation stopped", "script", inc.Script(), "incarnation", inc.ID())
	}()
}

// startCandidate opens the script's delivery (if any) and starts its incarnation. Values go only
// into the process environment and the scrub list of its output.
func (n *Node) startCandidate(s *state.Script, want desiredIdentity) (*running, error) {
	var env, scrub []string
	if s.Delivery != nil {
		values, err := n.store.OpenSecrets(s.Delivery.WorkerUID, s.Delivery.DeliveryID)
		if err != nil {
			return nil, err
		}
		for name, v := range values {
			env = append(env, workerd.SecretEnv(name)+"="+v.Reveal())
			scrub = append(scrub, v.Reveal())
		}
	}
	uid, err := n.orgUIDLocked(s.Labels.Organization)
	if err != nil {
		return nil, err
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	labels := s.Labels
	inc, err := supervisor.Start(supervisor.Spec{
		ID: want.id, Script: s.Name,
		Dir:   filepath.Join(n.store.IncarnationsDir(), s.Name+"-"+want.id[4:16]+"-"+hex.EncodeToString(suffix)),
		Files: want.config, Env: env, Scrub: scrub, UID: uid, Lines: n.lineBudget(labels.Organization), Log: n.logRingLocked(s.WorkerUID),
		Admitted:    s.Admitted == want.id,
		Braked:      func() bool { return n.braked(labels) },
		Callees:     s.Settings.ServiceBindings,
		MemoryBytes: s.Settings.LimitsOrZero().MemoryMB << 20,
	}, n.sup)
	if err != nil {
		return nil, err
	}
	inc.SetWallLimit(wallLimit(s))
	return &running{inc: inc, desiredIdentity: want}, nil
}

// logRingLocked is the log ring of a worker UID, created on first use (n.mu held for writing).
// Every incarnation of the worker appends to it, so its log reads across its deployments.
func (n *Node) logRingLocked(workerUID string) *workerlog.Ring {
	r := n.logs[workerUID]
	if r == nil {
		r = workerlog.New()
		n.logs[workerUID] = r
	}
	return r
}

// dropLogRingLocked forgets a deleted worker's log (n.mu held for writing).
func (n *Node) dropLogRingLocked(workerUID string) {
	if r := n.logs[workerUID]; r != nil {
		r.Close()
		delete(n.logs, workerUID)
	}
}

// lineBudget is the output-line budget an organization's incarnations share (SPEC 5.1: a tenant's
// log lines are rate-limited).
func (n *Node) lineBudget(org string) *supervisor.LineBudget {
	b, _ := n.lineBudgets.LoadOrStore(org, &supervisor.LineBudget{})
	return b.(*supervisor.LineBudget)
}

// braked reports whether a lifecycle brake covers a script with these labels.
func (n *Node) braked(l adminapi.Labels) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	for _, b := range n.desired.Brakes {
		if b.Matches(l) {
			return true
		}
	}
	return false
}

// Resolve implements edge.Resolver: the serving incarnation of the hostname's route, when Ready.
func (n *Node) Resolve(hostname string) (edge.Target, int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	route := n.desired.Routes[hostname]
	if route == nil {
		return nil, edge.UnknownHost
	}
	return n.servingLocked(route.ScriptName)
}

// servingLocked is the serving incarnation of a script, when Ready (n.mu held).
func (n *Node) servingLocked(name string) (edge.Target, int) {
	r := n.scripts[name]
	if n.desired.Scripts[name] == nil || r == nil || r.serving == nil || !r.serving.inc.Ready() {
		return nil, edge.NotReady
	}
	return r.serving.inc, edge.Found
}

// indexLocked keeps n.byUID's entry for the script name, desired as s (nil: deleted), up to date
// (n.mu held for writing).
func (n *Node) indexLocked(name string, r *scriptRun, s *state.Script) {
	uid := ""
	if s != nil {
		uid = s.WorkerUID
	}
	if r.workerUID == uid {
		return
	}
	if n.byUID[r.workerUID] == name {
		delete(n.byUID, r.workerUID)
	}
	if uid != "" {
		n.byUID[uid] = name
	}
	r.workerUID = uid
}

func incarnationStatus(x *running) *adminapi.Incarnation {
	if x == nil {
		return nil
	}
	st := x.inc.Status()
	return &adminapi.Incarnation{
		ID: x.id, DeploymentID: x.deploymentID, Generation: x.generation, DeliveryID: x.deliveryID,
		State: st.State, Reason: st.Reason, Message: st.Message, Restarts: st.Restarts, Incident: st.Incident,
		Address: st.Address, PID: st.PID,
	}
}

// scriptStatusLocked reports one script (n.mu held, read or write), with its version: a digest of
// the rest, so that any change to what it says changes it.
func (n *Node) scriptStatusLocked(name string) adminapi.ScriptStatus {
	out := n.scriptStateLocked(name)
	b, err := json.Marshal(out)
	if err != nil {
		panic(err) // plain strings, numbers and booleans
	}
	sum := sha256.Sum256(b)
	out.Version = hex.EncodeToString(sum[:8])
	return out
}

func (n *Node) scriptStateLocked(name string) adminapi.ScriptStatus {
	s := n.desired.Scripts[name]
	if s == nil {
		return adminapi.ScriptStatus{ScriptName: name, SecretNames: []string{}, Secrets: adminapi.SecretsStatus{Names: []string{}}}
	}
	out := adminapi.ScriptStatus{
		ScriptName: name, Present: true, WorkerUID: s.WorkerUID, DeploymentID: s.DeploymentID, Generation: s.Generation,
		BundleDigest: s.BundleDigest, Labels: s.Labels, SecretNames: append([]string{}, s.SecretNames...),
		Secrets: adminapi.SecretsStatus{Names: []string{}},
	}
	if d := s.Delivery; d != nil {
		out.Secrets = adminapi.SecretsStatus{Delivered: true, Names: append([]string{}, d.Names...), DeliveryID: d.DeliveryID}
	}
	r := n.scripts[name]
	if r == nil {
		out.Reason = adminapi.ReasonPending
		return out
	}
	switch {
	case r.serving != nil:
		out.Incarnation = incarnationStatus(r.serving)
		out.Candidate = incarnationStatus(r.candidate)
		if out.Candidate == nil {
			out.Candidate = incarnationStatus(r.failed)
		}
	case r.candidate != nil:
		out.Incarnation = incarnationStatus(r.candidate)
	default:
		out.Incarnation = incarnationStatus(r.failed)
	}
	want, err := n.wantLocked(r, s, false)
	current := err == nil && r.serving != nil && r.serving.id == want.id && r.serving.inc.Ready()
	secretsCurrent := len(s.SecretNames) == 0 ||
		(secretsCover(s) && r.serving != nil && r.serving.deliveryID == s.Delivery.DeliveryID)
	out.Ready = current && secretsCurrent
	switch {
	case out.Ready:
		out.Reason = adminapi.ReasonReady
	case r.problem != "":
		out.Reason = adminapi.ReasonFailed
		if out.Incarnation == nil {
			out.Incarnation = &adminapi.Incarnation{State: adminapi.StateFailed, Reason: adminapi.ReasonFailed, Message: r.problem}
		}
	case current:
		out.Reason = adminapi.ReasonSecretsPending
	case out.Candidate != nil && out.Candidate.State == adminapi.StateFailed:
		out.Reason = adminapi.ReasonFailed
	case r.candidate != nil && r.serving != nil && r.candidate.inc.Ready() && !secretsCover(s):
		out.Reason = adminapi.ReasonSecretsPending
	case r.candidate != nil && r.serving != nil:
		out.Reason = adminapi.ReasonPending
	case out.Incarnation != nil:
		out.Reason = out.Incarnation.Reason
	default:
		out.Reason = adminapi.ReasonPending
	}
	if r.serving != nil {
		if st := r.serving.inc.Status(); st.Incident {
			out.Incident, out.IncidentMessage = true, st.IncidentMessage
		}
	}
	return out
}

// secretsCover reports whether the script's delivery carries exactly the secrets it declares.
func secretsCover(s *state.Script) bool {
	return len(s.SecretNames) == 0 || (s.Delivery != nil && sameNames(s.Delivery.Names, s.SecretNames))
}

func sameNames(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	sort.Strings(x)
	sort.Strings(y)
	return slices.Equal(x, y)
}

// routeStatusLocked reports one route (n.mu held).
func (n *Node) routeStatusLocked(hostname string) adminapi.RouteStatus {
	route := n.desired.Routes[hostname]
	if route == nil {
		return adminapi.RouteStatus{Hostname: hostname}
	}
	out := adminapi.RouteStatus{Hostname: hostname, Present: true, ScriptName: route.ScriptName, EndpointUID: route.EndpointUID, DeploymentID: route.DeploymentID}
	if r := n.scripts[route.ScriptName]; r != nil && n.desired.Scripts[route.ScriptName] != nil && r.serving != nil {
		out.Ready = r.serving.inc.Ready()
	}
	return out
}

// wallLimit is a script's own wall-time limit per request at the edge: its limits.cpuMs (SPEC 3.6:
// on selfhost cpuMs bounds wall time), 0 for the edge's own.
func wallLimit(s *state.Script) time.Duration {
	return time.Duration(s.Settings.LimitsOrZero().CPUMs) * time.Millisecond
}

// bindingRouter routes what a worker sends through a service binding to the current Ready
// incarnation of the worker the binding names, through the edge (its limits, loop count and
// accounting), never straight to a socket.
type bindingRouter struct {
	n    *Node
	edge *edge.Handler
}

func (b bindingRouter) ServeBinding(w http.ResponseWriter, r *http.Request, from *supervisor.Incarnation, binding string) {
	caller := from.Script()
	b.edge.ServeBinding(w, r, caller, func() (edge.Target, int) { return b.n.resolveBinding(caller, from.Callee(binding)) })
}

// resolveBinding finds the callee a binding of the caller script names, by the worker UID the
// calling incarnation binds it to (each incarnation resolves with its own map: the one serving
// keeps its bindings while a newer deployment starts or is held): the script of that worker UID,
// of the caller's organization (the Host allows no other; the node checks again), and that
// script's serving incarnation when Ready.
func (n *Node) resolveBinding(caller, callee string) (edge.Target, int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	s := n.desired.Scripts[caller]
	if s == nil || callee == "" {
		return nil, edge.UnknownHost
	}
	name, ok := n.byUID[callee]
	c := n.desired.Scripts[name]
	if !ok || c == nil || c.WorkerUID != callee || c.Labels.Organization != s.Labels.Organization {
		return nil, edge.UnknownHost
	}
	return n.servingLocked(name)
}
