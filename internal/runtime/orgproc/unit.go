package orgproc

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
)

// unit is one incarnation placed in one process, under a loader id of that process: the
// incarnation id and an attempt number (workerd keeps a failed load cached under its id, so a
// failure that is not the code's retries under a new one). It is the edge's Target for the
// incarnation while it is the incarnation's current unit.
type unit struct {
	p        *Process
	inc      *Incarnation
	loaderID string
	attempt  int

	// probed: it answered its probe in this process (the second witness); probing: a probe
	// (a load the runtime asked for) is in progress.
	probed  atomic.Bool
	probing atomic.Bool
	// loaded: its isolate has been loaded in this process at some time (probed, or asked for by
	// a request): once retired, it still holds memory until the process is recycled.
	loaded atomic.Bool
	// held: the lifecycle brake holds its reload after its process restarted.
	held    atomic.Bool
	retired atomic.Bool

	inflight atomic.Int64
	// open are its requests in flight, and broken the last ones that ended unanswered: when each
	// began tells which a liveness kill implicates (blame).
	mu     sync.Mutex
	open   map[*flight]struct{}
	broken []brokenFlight
	// ended are when its last requests that reached it began and ended, and endedBefore the
	// latest end of those forgotten: which of its requests were in flight when one of its
	// subrequests was sent (blame).
	ended       []span
	endedBefore int64
}

// span is when a request began and ended (mono).
type span struct{ began, ended int64 }

// maxEnded is how many ended requests a unit remembers.
const maxEnded = 32

// Addr is the process's ingress socket, as the edge dials it.
func (u *unit) Addr() string { return u.p.sock.dialAddr }

// Script is the script the incarnation runs.
func (u *unit) Script() string { return u.inc.spec.Script }

// Incarnation is the loader id the router loads it under.
func (u *unit) Incarnation() string { return u.loaderID }

// Organization is the organization whose worker it is, for the edge's measures.
func (u *unit) Organization() string { return u.inc.spec.Org }

// Acquire counts one request in flight, unless the unit is retired (its incarnation drains, or
// moved to another process), in which case the caller looks the script up again. The count is
// taken before the check, so a drain that saw zero can never miss a request that got through.
func (u *unit) Acquire() (edge.Flight, bool) {
	u.inflight.Add(1)
	if u.retired.Load() {
		u.inflight.Add(-1)
		return nil, false
	}
	u.loaded.Store(true)
	fl := &flight{u: u, began: mono(), end: u.inc.spec.Meter.Begin()}
	u.mu.Lock()
	u.open[fl] = struct{}{}
	u.mu.Unlock()
	return fl, true
}

// flight is one request of a unit.
type flight struct {
	u      *unit
	began  int64 // mono
	caller string
	end    func()
	// answered: the worker's answer began; input and output: when, after it switched to another
	// protocol (a WebSocket), its client last sent the worker something and the worker its
	// client (mono; read by blame while the request is in flight).
	answered      atomic.Bool
	input, output atomic.Int64
	// withdrawn: it never reached the worker, so ending it unanswered says nothing of the worker.
	withdrawn bool
	done      bool
}

// Answered counts a response the worker began: liveness takes it as a witness that the process
// is not stuck, however late its probes are answered under load.
func (f *flight) Answered() {
	f.answered.Store(true)
	f.u.p.answered.Add(1)
	f.u.p.sawAnswer(mono())
}

// Input records that the client sent the worker something through the tunnel of a WebSocket.
func (f *flight) Input() { f.input.Store(mono()) }

// Output records that the worker sent its client something through the tunnel of a WebSocket.
func (f *flight) Output() { f.output.Store(mono()) }

// Withdraw ends a request that never reached the worker (a binding call handed back to be carried
// whole): neither an answer nor one that ended unanswered.
func (f *flight) Withdraw() {
	f.withdrawn = true
	f.Done()
}

// Done ends the request. One that ends unanswered is remembered a moment: its process may have
// died under it, and the death implicates it even when its connection broke first.
func (f *flight) Done() {
	if f.done {
		return
	}
	f.done = true
	f.end()
	u := f.u
	u.mu.Lock()
	delete(u.open, f)
	began, answered := f.began, f.answered.Load()
	if in := f.input.Load(); answered && in > f.output.Load() {
		// A WebSocket cut with its client's last message unanswered (its process may have died
		// on it) is remembered as a request begun with that message.
		began, answered = in, false
	}
	now := mono()
	if !f.withdrawn {
		u.ended = append(u.ended, span{began: f.began, ended: now})
		if len(u.ended) > maxEnded {
			u.endedBefore = max(u.endedBefore, u.ended[0].ended)
			u.ended = u.ended[1:]
		}
	}
	if !answered && !f.withdrawn {
		u.broken = append(u.broken, brokenFlight{began: began, caller: f.caller, at: now})
		if len(u.broken) > maxBroken {
			u.broken = u.broken[len(u.broken)-maxBroken:]
		}
	}
	u.mu.Unlock()
	u.inflight.Add(-1)
}

// brokenFlight is a request that ended unanswered: when it began and ended (mono), and the
// script whose call it served.
type brokenFlight struct {
	began, at int64
	caller    string
}

// maxBroken is how many unanswered requests a unit remembers.
const maxBroken = 16

// WallLimit is the worker's own wall-time limit per request (0: the edge's).
func (u *unit) WallLimit() time.Duration { return u.inc.WallLimit() }

// candidate answers, in one read, its requests in flight at since (mono) or later (those still
// in flight, and those that ended unanswered since: a request's connection may break before the
// runtime sees its process's end), and its last requests that ended, with the latest end of
// those it forgot.
func (u *unit) candidate(since int64) candidate {
	u.mu.Lock()
	defer u.mu.Unlock()
	c := candidate{u: u, ended: slices.Clone(u.ended), endedBefore: u.endedBefore}
	for f := range u.open {
		c.flights = append(c.flights, begun{at: f.began, caller: f.caller, answered: f.answered.Load(), input: f.input.Load(), output: f.output.Load(), open: true})
	}
	for _, b := range u.broken {
		if b.at >= since {
			c.flights = append(c.flights, begun{at: b.began, caller: b.caller})
		}
	}
	return c
}

// begun is a request in flight: when it began (mono), the script whose call it serves, whether
// its answer began (it streams, or is a WebSocket), for a WebSocket when its client and its
// worker last sent each other something (mono; 0: never), and whether it is still in flight.
type begun struct {
	at            int64
	caller        string
	answered      bool
	input, output int64
	// open: still in flight when read (not one that ended unanswered).
	open bool
}

// waiting reports whether the request may be waiting for the thread, and since when: one whose
// answer has not begun, since it began; a WebSocket whose client sent something after the worker
// last sent anything and after the process's last answer (a message the thread has not been free
// for since), since then. A stream, or any other WebSocket, is not waiting for anything: many
// clients send what no answer follows (acknowledgements, heartbeats, fire-and-forget messages).
func (b begun) waiting(lastAnswer int64) (int64, bool) {
	switch {
	case !b.answered:
		return b.at, true
	case b.input > b.output && b.input >= lastAnswer:
		return b.input, true
	}
	return 0, false
}

// CalledBy records the script whose subrequest or binding call the request serves.
func (f *flight) CalledBy(script string) {
	f.u.mu.Lock()
	f.caller = script
	f.u.mu.Unlock()
}

// monoBase is the origin of mono.
var monoBase = time.Now()

// mono is now in nanoseconds since monoBase, on the monotonic clock: instants of requests and
// answers compared across goroutines, which a step of the wall clock must not reorder.
func mono() int64 { return int64(time.Since(monoBase)) }
