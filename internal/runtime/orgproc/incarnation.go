package orgproc

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/scrub"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sourcemaps"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// Spec is one incarnation as the Manager runs it. Its ID is the identity continuity preserves:
// the exact bundle and config digests (secrets by keyed digest).
type Spec struct {
	ID     string
	Script string
	// Org is the organization whose process holds it, and UID that organization's sandbox uid
	// (unused without a sandbox).
	Org string
	UID int
	// Labels are its script's, for the lifecycle brakes.
	Labels adminapi.Labels
	// Admitted: it has served before, so it reloads on demand after a restart, unprobed.
	Admitted bool
	// Alone runs it in a process of its own (its offering says so).
	Alone bool
	// BundleBytes is the size of its code (modules, source maps left out): its isolate's memory
	// grows with it.
	BundleBytes int64
	// Code is what the router loads it from, built on each load (secrets are read then).
	Code func() (*Code, error)
	// Scrub removes its delivered values from what it prints and from its failure messages.
	Scrub scrub.Scrubber
	// Places names original files and lines for the places its log names in modules that have
	// a source map (nil: none has).
	Places *sourcemaps.Mapper
	// Log is the worker's log ring (nil: none is kept), and Lines its organization's output
	// budget, shared by all the organization's incarnations.
	Log   *workerlog.Ring
	Lines *workerlog.Budget
	// Meter is its subrequest accounting (the cap in flight, and the budget of each request).
	Meter *egress.Meter
	// Callees are its service bindings: the worker UID each name binds to (SetCallees changes
	// them in place).
	Callees map[string]string
}

// Code is what the router hands the Worker Loader for one incarnation (workerd.Code's wire
// form). Text holds plain variables and secret values alike: it is built when the process asks,
// sent, and dropped.
type Code struct {
	CompatibilityDate  string            `json:"compatibilityDate"`
	CompatibilityFlags []string          `json:"compatibilityFlags"`
	MainModule         string            `json:"mainModule"`
	Modules            []Module          `json:"modules"`
	Text               map[string]string `json:"text"`
	JSON               map[string]string `json:"json"`
	Services           []string          `json:"services"`
}

// Module is one module of a Code: its name, type (js, text, json) and source.
type Module struct {
	Name  string `json:"name"`
	Type  string `json:"type"`
	Value string `json:"value"`
}

// Status is a snapshot of an incarnation.
type Status struct {
	State             string
	Reason            string
	Message           string
	Restarts          int
	Incident          bool
	IncidentMessage   string
	Quarantined       bool
	QuarantineMessage string
	// PID is its process's workerd (or the bwrap holding it), Address its process's ingress
	// socket, and Loader the id its process's router loads it under (the Takoform-Incarnation
	// header a request to Address names).
	PID     int
	Address string
	Loader  string
}

// Incarnation is one script identity on the node, in whichever process holds it now.
type Incarnation struct {
	spec Spec
	m    *Manager
	log  *slog.Logger

	// cur is the unit the edge sends its requests to.
	cur     atomic.Pointer[unit]
	ready   atomic.Bool // mirrors Status().State == ready, for the edge's hot path
	wall    atomic.Int64
	callees atomic.Pointer[map[string]string]
	retired atomic.Bool

	mu       sync.Mutex
	admitted bool
	// units are where it is placed: usually one; two while its process is recycled.
	units []*unit
	// failed says why it failed for good ("" while it has not).
	failed string
	// implications are when it was implicated in a kill or abort of its process (SPEC 5.1).
	implications []time.Time
	restarts     int
	// quarantined: it runs alone for its implications; blocked: it waits for a quarantine
	// process, answering 503 meanwhile.
	quarantined bool
	blocked     bool

	stopOnce sync.Once
	done     chan struct{}
}

func newIncarnation(m *Manager, spec Spec) *Incarnation {
	inc := &Incarnation{spec: spec, m: m, admitted: spec.Admitted, done: make(chan struct{}),
		log: m.log.With("script", spec.Script, "incarnation", spec.ID)}
	inc.SetCallees(spec.Callees)
	return inc
}

// ID is the incarnation's identity.
func (i *Incarnation) ID() string { return i.spec.ID }

// Script is the script it runs.
func (i *Incarnation) Script() string { return i.spec.Script }

// Org is the organization it belongs to.
func (i *Incarnation) Org() string { return i.spec.Org }

// Meter is its subrequest accounting.
func (i *Incarnation) Meter() *egress.Meter { return i.spec.Meter }

// Ready reports whether both witnesses hold now and nothing holds it back.
func (i *Incarnation) Ready() bool { return i.ready.Load() }

// Target is where the edge sends its requests now (nil while it is not Ready).
func (i *Incarnation) Target() edge.Target {
	if !i.ready.Load() {
		return nil
	}
	if u := i.cur.Load(); u != nil {
		return u
	}
	return nil
}

// Admit marks it as having served: from now on it reloads on demand after a restart.
func (i *Incarnation) Admit() {
	i.mu.Lock()
	i.admitted = true
	i.mu.Unlock()
	i.refresh()
}

// InFlight is the number of its requests in flight, in every process it is placed in.
func (i *Incarnation) InFlight() int64 {
	var n int64
	for _, u := range i.placed() {
		n += u.inflight.Load()
	}
	return n
}

// Done is closed once it has stopped for good (stopped, or failed).
func (i *Incarnation) Done() <-chan struct{} { return i.done }

// SetWallLimit sets its own wall-time limit per request (0: the edge's). It changes with the
// worker's limits, not its code, so it takes effect in place.
func (i *Incarnation) SetWallLimit(d time.Duration) { i.wall.Store(int64(d)) }

// WallLimit is its wall-time limit per request (0: the edge's).
func (i *Incarnation) WallLimit() time.Duration { return time.Duration(i.wall.Load()) }

// SetCallees sets the worker UID each of its service bindings names. The binding names are its
// code's; the workers they reach are the node's to decide on each call, so this takes effect in
// place.
func (i *Incarnation) SetCallees(callees map[string]string) {
	c := maps.Clone(callees)
	i.callees.Store(&c)
}

// Callee is the worker UID its service binding named binding reaches now ("" for none).
func (i *Incarnation) Callee(binding string) string {
	if c := i.callees.Load(); c != nil {
		return (*c)[binding]
	}
	return ""
}

// Drain retires it: no new request reaches it, those in flight finish (up to timeout), and it
// leaves its process (whose code socket never gives its code again).
func (i *Incarnation) Drain(timeout time.Duration) {
	i.retired.Store(true)
	units := i.placed()
	for _, u := range units {
		u.retired.Store(true)
	}
	i.refresh()
	deadline := time.Now().Add(timeout)
	for _, u := range units {
		for u.inflight.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := u.inflight.Load(); n > 0 {
			i.log.Warn("drain deadline passed with requests in flight", "inFlight", n)
		}
	}
	i.Stop()
}

// Stop retires it at once (its requests in flight end with it) and returns once it has left its
// processes.
func (i *Incarnation) Stop() {
	i.retired.Store(true)
	for _, u := range i.placed() {
		u.p.retire(u)
	}
	i.finish()
}

// finish closes done once, and tells whoever watches.
func (i *Incarnation) finish() {
	i.stopOnce.Do(func() {
		close(i.done)
		i.refresh()
		i.m.opts.Changed(i)
	})
}

// placed lists its units.
func (i *Incarnation) placed() []*unit {
	i.mu.Lock()
	defer i.mu.Unlock()
	return slices.Clone(i.units)
}

// addUnit records u as one of its units; current makes it the one requests go to.
func (i *Incarnation) addUnit(u *unit, current bool) {
	i.mu.Lock()
	i.units = append(i.units, u)
	i.mu.Unlock()
	if current {
		i.cur.Store(u)
	}
}

// dropUnit forgets u (its process retired it).
func (i *Incarnation) dropUnit(u *unit) {
	i.mu.Lock()
	i.units = slices.DeleteFunc(i.units, func(x *unit) bool { return x == u })
	i.mu.Unlock()
}

// fail ends it for good: a candidate whose code does not load, or that stalled or ended its
// process while loading. It leaves its processes.
func (i *Incarnation) fail(why string) {
	i.mu.Lock()
	if i.failed != "" {
		i.mu.Unlock()
		return
	}
	i.failed = why
	i.mu.Unlock()
	i.log.Warn("incarnation failed", "reason", why)
	i.Stop()
}

// isAdmitted reports whether it has served.
func (i *Incarnation) isAdmitted() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.admitted
}

// implicate records that it was implicated in its process's kill or abort, and answers whether
// it must now run alone (SPEC 5.1: twice within an hour) and whether this implication opened an
// incident (the IncidentImplications-th within IncidentWindow).
func (i *Incarnation) implicate(now time.Time) (alone, incident bool) {
	i.mu.Lock()
	defer i.mu.Unlock()
	i.implications = append(slices.DeleteFunc(i.implications, func(t time.Time) bool { return now.Sub(t) >= IncidentWindow }), now)
	n := 0
	for _, t := range i.implications {
		if now.Sub(t) < QuarantineWindow {
			n++
		}
	}
	return n >= QuarantineImplications, len(i.implications) == IncidentImplications
}

// Status returns a snapshot.
func (i *Incarnation) Status() Status {
	st, _ := i.status(time.Now())
	return st
}

// status derives the incarnation's status, and whether it is Ready, from its own state and its
// process's.
func (i *Incarnation) status(now time.Time) (Status, bool) {
	u := i.cur.Load()
	i.mu.Lock()
	st := Status{Restarts: i.restarts, Quarantined: i.quarantined || i.blocked}
	n := 0
	for _, t := range i.implications {
		if now.Sub(t) < IncidentWindow {
			n++
		}
	}
	if n >= IncidentImplications {
		st.Incident = true
		st.IncidentMessage = fmt.Sprintf("implicated in %d kills or aborts of its process within an hour; retries continue", n)
	}
	switch {
	case i.blocked:
		st.QuarantineMessage = fmt.Sprintf("implicated in repeated kills of its organization's process, and the organization already has %d quarantine processes on this node: it answers 503 until one is free", MaxQuarantine)
	case i.quarantined:
		st.QuarantineMessage = "implicated in repeated kills of its organization's process: it runs in a process of its own"
	}
	failed, admitted, blocked := i.failed, i.admitted, i.blocked
	i.mu.Unlock()

	switch {
	case failed != "":
		st.State, st.Reason, st.Message = adminapi.StateFailed, adminapi.ReasonFailed, failed
		return st, false
	case i.retired.Load():
		st.State, st.Reason, st.Message = adminapi.StatePending, adminapi.ReasonPending, "stopped"
		return st, false
	case blocked:
		st.State, st.Reason, st.Message = adminapi.StatePending, adminapi.ReasonQuarantined, st.QuarantineMessage
		return st, false
	case u == nil:
		st.State, st.Reason, st.Message = adminapi.StatePending, adminapi.ReasonPending, "waiting for a process"
		return st, false
	}
	ps := u.p.state()
	st.PID, st.Address, st.Loader = ps.pid, u.p.sock.ingressPath, u.loaderID
	switch {
	case ps.phase != phaseRunning:
		st.State, st.Reason, st.Message = adminapi.StatePending, ps.reason, ps.message
		return st, false
	case u.held.Load():
		st.State, st.Reason, st.Message = adminapi.StatePending, adminapi.ReasonBraked, "the lifecycle brake holds this incarnation's reload"
		return st, false
	case !u.probed.Load() && !admitted:
		st.State, st.Reason, st.Message = adminapi.StatePending, adminapi.ReasonPending, "its process is running; waiting for its probe to be answered"
		return st, false
	}
	st.State, st.Reason = adminapi.StateReady, adminapi.ReasonReady
	return st, true
}

// refresh recomputes Ready for the edge; it reports whether it changed.
func (i *Incarnation) refresh() bool {
	_, ready := i.status(time.Now())
	return i.ready.Swap(ready) != ready
}
