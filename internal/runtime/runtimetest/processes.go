package runtimetest

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
)

// Processes runs a node's incarnations without workerd, for tests of the admin API, the
// reconciler and the edge's routing: an incarnation is Ready as soon as it is placed (unless the
// test holds or fails its script), loads its code once as a process would, and answers every
// request the edge sends it with "<script> <incarnation id>". No code of the worker runs.
type Processes struct {
	srv *httptest.Server

	mu      sync.Mutex
	changed func(script string)
	byID    map[string]*incarnation // the live ones, by incarnation id
	started []orgproc.Spec
	fail    map[string]string
	hold    map[string]bool
	closed  bool
}

// StartWithoutWorkerd runs a node whose incarnations are Processes' (no workerd, no sandbox).
func StartWithoutWorkerd(tb testing.TB, mutate ...func(*runtime.Config)) (*Harness, *Processes) {
	tb.Helper()
	p := &Processes{byID: map[string]*incarnation{}, fail: map[string]string{}, hold: map[string]bool{}}
	p.srv = httptest.NewServer(http.HandlerFunc(p.serve))
	tb.Cleanup(p.srv.Close)
	h := start(tb, "", append([]func(*runtime.Config){func(c *runtime.Config) { c.Processes = p.open }}, mutate...)...)
	return h, p
}

// open is the node's runtime.NewProcesses: a restarted node gets the same Processes back.
func (p *Processes) open(changed func(string)) (runtime.Processes, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.changed, p.closed = changed, false
	return p, nil
}

// Fail makes every later start of script fail with message, until Clear.
func (p *Processes) Fail(script, message string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.fail[script] = message
}

// Hold keeps every later start of script pending (placed, never Ready), until Clear.
func (p *Processes) Hold(script string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.hold[script] = true
}

// Clear lets script's held incarnations become Ready and its later starts succeed.
func (p *Processes) Clear(script string) {
	p.mu.Lock()
	delete(p.fail, script)
	delete(p.hold, script)
	var moved []*incarnation
	for _, inc := range p.byID {
		if inc.spec.Script == script {
			moved = append(moved, inc)
		}
	}
	changed := p.changed
	p.mu.Unlock()
	for _, inc := range moved {
		inc.set(func(i *incarnation) { i.held = false })
	}
	if len(moved) > 0 {
		changed(script)
	}
}

// Started is every incarnation placed so far, in order.
func (p *Processes) Started() []orgproc.Spec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]orgproc.Spec(nil), p.started...)
}

// Live is the ids of the incarnations placed and not yet stopped, of script.
func (p *Processes) Live(script string) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for id, inc := range p.byID {
		if inc.spec.Script == script {
			out = append(out, id)
		}
	}
	return out
}

// Start implements runtime.Processes. Like an org process it loads the code once (a failure to
// build it fails the incarnation).
func (p *Processes) Start(spec orgproc.Spec) (runtime.Incarnation, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, fmt.Errorf("processes closed")
	}
	p.started = append(p.started, spec)
	inc := &incarnation{p: p, spec: spec, admitted: spec.Admitted, held: p.hold[spec.Script], failed: p.fail[spec.Script], done: make(chan struct{})}
	if inc.failed == "" {
		if _, err := spec.Code(); err != nil {
			inc.failed = "load: " + err.Error()
		}
	}
	if inc.failed != "" {
		inc.finish()
	} else {
		p.byID[spec.ID] = inc
	}
	inc.ready.Store(inc.failed == "" && !inc.held)
	changed, script := p.changed, spec.Script
	// The node is told as a real process would tell it: after the fact, from elsewhere.
	go changed(script)
	return inc, nil
}

// WakeAll implements runtime.Processes: nothing here waits on a brake.
func (p *Processes) WakeAll() {}

// Close implements runtime.Processes: every incarnation stops.
func (p *Processes) Close() {
	p.mu.Lock()
	live := p.byID
	p.byID, p.closed = map[string]*incarnation{}, true
	p.mu.Unlock()
	for _, inc := range live {
		inc.finish()
	}
}

func (p *Processes) serve(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(edge.IncarnationHeader)
	p.mu.Lock()
	inc := p.byID[id]
	p.mu.Unlock()
	if inc == nil {
		http.Error(w, "no such incarnation here", http.StatusBadGateway)
		return
	}
	fmt.Fprintf(w, "%s %s", inc.spec.Script, id)
}

type incarnation struct {
	p    *Processes
	spec orgproc.Spec

	mu             sync.Mutex
	admitted, held bool
	stopped        bool
	failed         string
	callees        map[string]string
	ready          atomic.Bool
	inflight       atomic.Int64
	wall           atomic.Int64
	done           chan struct{}
	doneOnce       sync.Once
}

func (i *incarnation) set(change func(*incarnation)) {
	i.mu.Lock()
	change(i)
	ready := i.failed == "" && !i.held && !i.stopped
	i.mu.Unlock()
	i.ready.Store(ready)
}

func (i *incarnation) ID() string     { return i.spec.ID }
func (i *incarnation) Script() string { return i.spec.Script }
func (i *incarnation) Ready() bool    { return i.ready.Load() }

func (i *incarnation) Status() orgproc.Status {
	i.mu.Lock()
	defer i.mu.Unlock()
	switch {
	case i.failed != "":
		return orgproc.Status{State: adminapi.StateFailed, Reason: adminapi.ReasonFailed, Message: i.failed}
	case i.stopped:
		return orgproc.Status{State: adminapi.StatePending, Reason: adminapi.ReasonPending, Message: "stopped"}
	case i.held:
		return orgproc.Status{State: adminapi.StatePending, Reason: adminapi.ReasonPending, Message: "held by the test"}
	}
	return orgproc.Status{State: adminapi.StateReady, Reason: adminapi.ReasonReady, Loader: i.spec.ID}
}

func (i *incarnation) Target() edge.Target {
	if !i.Ready() {
		return nil
	}
	return target{i}
}

func (i *incarnation) Admit()                       { i.set(func(i *incarnation) { i.admitted = true }) }
func (i *incarnation) InFlight() int64              { return i.inflight.Load() }
func (i *incarnation) SetWallLimit(d time.Duration) { i.wall.Store(int64(d)) }
func (i *incarnation) SetCallees(callees map[string]string) {
	i.set(func(i *incarnation) { i.callees = callees })
}
func (i *incarnation) Done() <-chan struct{} { return i.done }

// Drain waits for the requests in flight (bounded), then stops.
func (i *incarnation) Drain(timeout time.Duration) {
	i.set(func(i *incarnation) { i.stopped = true })
	for deadline := time.Now().Add(timeout); i.inflight.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	i.Stop()
}

func (i *incarnation) Stop() {
	i.set(func(i *incarnation) { i.stopped = true })
	i.p.mu.Lock()
	if i.p.byID[i.spec.ID] == i {
		delete(i.p.byID, i.spec.ID)
	}
	changed := i.p.changed
	i.p.mu.Unlock()
	i.finish()
	changed(i.spec.Script)
}

func (i *incarnation) finish() { i.doneOnce.Do(func() { close(i.done) }) }

// target is an incarnation as the edge reaches it.
type target struct{ i *incarnation }

func (t target) Addr() string         { return t.i.p.srv.Listener.Addr().String() }
func (t target) Script() string       { return t.i.spec.Script }
func (t target) Incarnation() string  { return t.i.spec.ID }
func (t target) Organization() string { return t.i.spec.Org }

func (t target) Acquire() (edge.Flight, bool) {
	t.i.inflight.Add(1)
	if !t.i.Ready() {
		t.i.inflight.Add(-1)
		return nil, false
	}
	return flight{t.i}, true
}

type flight struct{ i *incarnation }

func (flight) Answered() {}
func (f flight) Done()   { f.i.inflight.Add(-1) }
