package runtime

import (
	"net/http"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/scrub"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// processOptions are the org processes' options: the node's tuning, and its hooks for what
// workers send out and for the brakes.
func (n *Node) processOptions(bin, channels string) orgproc.Options {
	cfg := n.cfg
	return orgproc.Options{
		Workerd: bin, Sandbox: n.sandbox, SocketsDir: n.store.SocketsDir(), ChannelsDir: channels, Logger: n.log,
		Backoff: cfg.RestartBackoff, MaxBackoff: cfg.MaxRestartBackoff,
		StartDeadline: cfg.ProbeDeadline, ProbeDeadline: cfg.ProbeDeadline,
		LivenessPeriod: cfg.LivenessPeriod, LivenessTimeout: cfg.LivenessTimeout, SuspectFor: cfg.StalledSuspectFor, LoadAllowance: cfg.LoadAllowance, DrainTimeout: cfg.DrainTimeout,
		HeapLimitMB: cfg.HeapLimitMB, RecycleSecretsAfter: cfg.RecycleSecretsAfter, BeforeCode: cfg.BeforeCode,
		BrakedOrg:         func(org string) bool { return n.braked(adminapi.Labels{Organization: org}) },
		BrakedIncarnation: n.braked,
		Egress: func(w http.ResponseWriter, r *http.Request, from *orgproc.Incarnation) {
			n.egress.Serve(w, r, from.Meter(), from.Script())
		},
		Binding:   n.serveBinding,
		Changed:   func(i *orgproc.Incarnation) { n.nudge(i.Script()) },
		Restarted: func(i *orgproc.Incarnation) { n.metrics.restarts.WithLabelValues(i.Script()).Inc() },
	}
}

// nudge asks the reconciler to look at one script again (one of its incarnations changed state).
// It never waits for n.mu: an incarnation may change state, and call it, while n.mu is held.
// unreadableCodeID stands in scriptRun.unstartable for a desired script whose code could not be
// read from the store (it has no identity to name): its retries back off as a start's do.
const unreadableCodeID = "(unreadable code)"

func (n *Node) nudge(script string) {
	n.kickMu.Lock()
	n.dirty[script] = true
	n.kickMu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// addressRefresh is how often the node's addresses are read again for the egress policy.
const addressRefresh = 30 * time.Second

func (n *Node) reconciler() {
	refresh := time.NewTicker(addressRefresh)
	defer refresh.Stop()
	for {
		select {
		case <-n.stopped:
			return
		case <-refresh.C:
			if err := n.policy.Refresh(); err != nil {
				n.log.Error("read this node's addresses again for the egress policy", "error", err)
			}
		case <-n.kick:
			n.kickMu.Lock()
			dirty := n.dirty
			n.dirty = map[string]bool{}
			n.kickMu.Unlock()
			// Only the scripts whose incarnations moved: a node's other tenants cost a kick
			// nothing, however many scripts they hold.
			n.mu.Lock()
			for name := range dirty {
				if _, ok := n.scripts[name]; ok && !n.closing {
					n.reconcileLocked(name)
				}
				// An incarnation of it changed state (that is what kicks): its status may have too.
				n.signalLocked(name)
			}
			n.mu.Unlock()
		}
	}
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
//   - otherwise a candidate for the desired identity is placed in its organization's process
//     beside it, and once Ready it becomes the serving one (the edge switches), is admitted
//     (continuity now keeps exactly it), and the previous one drains and leaves;
//   - a failed candidate stays failed (the incumbent keeps serving) until the Host asks again;
//   - a candidate that could not even be placed is tried again after a capped backoff, or at
//     once when the Host asks again.
//
// It returns the incarnations it retired, which finish leaving in the background.
func (n *Node) reconcileLocked(name string) []Incarnation {
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
	var retired []Incarnation
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
		// answer waits for every incarnation of the script.
		for inc := range n.stopping[name] {
			if !containsInc(retired, inc) {
				retired = append(retired, inc)
			}
		}
		return retired
	}
	want, err := n.wantLocked(r, s, true)
	if err != nil {
		r.problem = "the desired deployment cannot be run: " + err.Error()
		if unreadable(err) && (r.unstartable != unreadableCodeID || !time.Now().Before(r.retryAt)) {
			// Not final (a read may succeed later): reconciled again after a pause that doubles
			// while the read keeps failing, one retry pending at a time.
			r.backoff = nextStartBackoff(r.backoff, r.unstartable == unreadableCodeID)
			r.unstartable, r.retryAt = unreadableCodeID, time.Now().Add(r.backoff)
			n.log.Error("read a script's code", "script", name, "error", err, "retryIn", r.backoff.String())
			time.AfterFunc(r.backoff, func() { n.nudge(name) })
		}
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
		r.unstartable, r.backoff = "", 0
		if r.serving == nil && s.Admitted == want.id {
			// The incarnation the script had admitted (the node restarted): it serves again as
			// soon as its process runs, with no candidate's promotion in between.
			r.serving, r.failed = c, nil
			return retired
		}
		r.candidate, r.failed = c, nil
	}
	// The candidate is the desired identity: a binding to another callee since it started is
	// taken in place (the serving incarnation keeps its own until the candidate replaces it).
	r.candidate.inc.SetCallees(s.Settings.ServiceBindings)
	r.candidate.inc.SetWallLimit(wallLimit(s))
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

func containsInc(list []Incarnation, inc Incarnation) bool {
	for _, x := range list {
		if x == inc {
			return true
		}
	}
	return false
}

// served is the script as its admitted incarnation runs it: s itself when its desired content
// is what was admitted, else its Serving content with the delivery it was admitted with (nil when
// that delivery was replaced since: its values are gone, so it cannot run again).
func served(s *state.Script) *state.Script {
	if s.Serving == nil {
		return nil
	}
	old := *s
	old.DeploymentID, old.Generation = s.Serving.DeploymentID, s.Serving.Generation
	old.Modules, old.MainModule, old.CompatibilityDate = s.Serving.Modules, s.Serving.MainModule, s.Serving.CompatibilityDate
	old.Settings = s.Serving.Settings
	switch {
	case s.Serving.DeliveryID == "":
		old.Delivery = nil
	case s.Delivery == nil || s.Delivery.DeliveryID != s.Serving.DeliveryID:
		return nil
	}
	return &old
}

// resumeServingLocked, at start-up, places again the incarnation a script had admitted when a
// newer deployment has replaced its desired content since (that one never served, or failed): the
// incumbent serves again at once, and the newer one is then only a candidate beside it, as before
// the restart. An incumbent whose values were replaced by a newer delivery cannot run again.
func (n *Node) resumeServingLocked(name string) {
	s := n.desired.Scripts[name]
	if s == nil || s.Serving == nil || s.Admitted == "" {
		return
	}
	if want, err := identity(s, n.store.Modules); err == nil && want.id == s.Admitted {
		return // the desired content is the admitted incarnation: reconcile places it
	}
	// Otherwise the admitted incumbent serves again (also when the desired content's identity
	// cannot be derived now: if it is the incumbent's, the incumbent is what it derives to).
	old := served(s)
	if old == nil {
		return
	}
	id, err := identity(old, n.store.Modules)
	if err != nil || id.id != s.Admitted {
		return
	}
	r, err := n.startCandidate(old, id)
	if err != nil {
		n.log.Error("place the admitted incarnation again", "script", name, "error", err)
		return
	}
	n.scripts[name] = &scriptRun{serving: r}
	n.log.Info("incarnation serving again after a restart", "script", name, "incarnation", id.id, "generation", id.generation)
}

// upgradeAdmittedLocked moves a desired state written by an earlier runtime (the
// process-per-incarnation model, whose identities digested a whole workerd config) to this one's
// identities (n.mu held): what each script had admitted, its Serving content, is admitted under its
// identity now, so that it serves at once through the isolate model, and a newer deployment is a
// candidate beside it as before (SPEC 5: a node with incarnations of the earlier model moves them
// into org processes on upgrade).
func (n *Node) upgradeAdmittedLocked() {
	next := *n.desired
	next.Scripts = make(map[string]*state.Script, len(n.desired.Scripts))
	moved := 0
	for name, s := range n.desired.Scripts {
		next.Scripts[name] = s
		if s.Admitted == "" {
			continue
		}
		cp := *s
		cp.Admitted = ""
		if old := served(s); old != nil {
			if id, err := identity(old, n.store.Modules); err == nil {
				cp.Admitted = id.id
				moved++
			}
		}
		next.Scripts[name] = &cp
	}
	next.Version = state.IsolateVersion
	if err := n.store.Save(&next); err != nil {
		n.log.Error("persist the upgraded desired state (it is upgraded again at the next start)", "error", err)
	}
	n.desired = &next
	n.log.Info("desired state upgraded to the isolate model", "admitted", moved)
}

// awaitResumed waits, up to timeout, until the processes of the incarnations resumed at start-up
// run (their incarnations Ready), or failed.
func (n *Node) awaitResumed(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		pending := false
		n.mu.RLock()
		for _, r := range n.scripts {
			if r.serving != nil && !r.serving.inc.Ready() && !isDone(r.serving.inc) && !waitsForQuarantine(r.serving.inc) {
				pending = true
				break
			}
		}
		n.mu.RUnlock()
		if !pending {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitsForQuarantine reports whether inc waits for a quarantine process of its organization to
// be free (answering 503 meanwhile), which may take any time.
func waitsForQuarantine(inc Incarnation) bool {
	return inc.Status().Reason == adminapi.ReasonQuarantined
}

func isDone(inc Incarnation) bool {
	select {
	case <-inc.Done():
		return true
	default:
		return false
	}
}

// retire takes an incarnation out of service in the background: drained (its requests in flight
// finish, bounded) when it has served, at once when it never did. Until it has left its process
// it stays in the script's stopping set, so that a delete of the script waits for it too (n.mu
// held).
func (n *Node) retire(inc Incarnation, drain bool) {
	n.retiring.Add(1)
	if n.stopping[inc.Script()] == nil {
		n.stopping[inc.Script()] = map[Incarnation]bool{}
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
		n.log.Info("incarnation retired", "script", inc.Script(), "incarnation", inc.ID())
	}()
}

// startCandidate places the script's incarnation in its organization's process (n.mu held). Its
// delivered values are read only to scrub what it prints; the process gets them over its own
// socket when it loads it.
func (n *Node) startCandidate(s *state.Script, want desiredIdentity) (*running, error) {
	var values []string
	if s.Delivery != nil {
		opened, err := n.store.OpenSecrets(s.Delivery.WorkerUID, s.Delivery.DeliveryID)
		if err != nil {
			return nil, err
		}
		for _, v := range opened {
			values = append(values, v.Reveal())
		}
	}
	uid, err := n.orgUIDLocked(s.Labels.Organization)
	if err != nil {
		return nil, err
	}
	inc, err := n.procs.Start(orgproc.Spec{
		ID: want.id, Script: s.Name, Org: s.Labels.Organization, UID: uid, Labels: s.Labels,
		Admitted: s.Admitted == want.id, Code: n.code(s), Scrub: scrub.New(values),
		Places: n.sourceMaps.For(s.Labels.Organization, want.id, s.Modules.Names(), func(module string) (string, error) {
			return n.store.Module(s.Modules, module)
		}),
		BundleBytes: s.Modules.CodeBytes(),
		Log:         n.logRingLocked(s.WorkerUID), Lines: n.lineBudget(s.Labels.Organization),
		Meter:   egress.NewMeter(n.cfg.SubrequestLimit, n.cfg.SubrequestsPerRequest, n.cfg.WaitUntilAfter),
		Callees: s.Settings.ServiceBindings,
	})
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
func (n *Node) lineBudget(org string) *workerlog.Budget {
	b, _ := n.lineBudgets.LoadOrStore(org, &workerlog.Budget{})
	return b.(*workerlog.Budget)
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

// wallLimit is a script's own wall-time limit per request at the edge: its limits.cpuMs (SPEC 3.6:
// on selfhost cpuMs bounds wall time), 0 for the edge's own.
func wallLimit(s *state.Script) time.Duration {
	return time.Duration(s.Settings.LimitsOrZero().CPUMs) * time.Millisecond
}
