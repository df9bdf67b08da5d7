// Package supervisor runs incarnations: one workerd process each, on a loopback socket the
// supervisor opens and hands to workerd, with a generated config in a private directory.
//
// An incarnation is Ready on two witnesses (SPEC 5, seed 004): the supervisor observed its process
// running (started and not exited), and the built-in probe (the runtime's own worker) answered on its own socket. The
// probe never runs the user's code; workerd serves nothing until the whole config, the user's
// script included, has compiled, so an answer also means the script loaded. Once Ready, the probe
// runs periodically (SPEC 5.1): a worker stuck in a loop holds workerd's one thread, the probe
// goes unanswered, and after a few misses in a row the process is killed (RuntimeUnresponsive) and
// restarted by continuity.
// A process that dies is restarted as the same incarnation (same files, same socket, same
// environment) with capped exponential backoff; nothing about it is rebuilt. A candidate that has
// never been admitted gives up after a few early exits or when its probe deadline passes (failed,
// RuntimeFailed); an admitted incarnation is retried for as long as it is wanted, and six restarts
// within an hour raise an incident while retries continue. The lifecycle brake holds restarts.
package supervisor

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// Incident rule (SPEC 5): this many restarts within IncidentWindow raise an incident.
const (
	IncidentRestarts = 6
	IncidentWindow   = time.Hour
	// ConfigFile is the name of the generated workerd config inside an incarnation's directory.
	ConfigFile = "config.capnp"
	// ConfigConst is the constant of ConfigFile that holds the workerd Config.
	ConfigConst = "config"
	// SocketName is the config's socket that workerd serves on the descriptor the supervisor opens.
	SocketName = "http"
	// LivenessMisses is how many probes in a row a Ready incarnation may miss before it is killed.
	LivenessMisses = 3
)

// Options tune every incarnation of one supervisor.
type Options struct {
	// Workerd is the path of the workerd binary.
	Workerd string
	// Sandbox runs each workerd as its organization's uid in its own namespaces and cgroups (SPEC
	// 5.1); nil runs it as the node's own user (--insecure-no-sandbox).
	Sandbox *sandbox.Sandbox
	Logger  *slog.Logger
	// Backoff is the first restart delay; it doubles up to MaxBackoff, and starts over once a process
	// has stayed up for StableAfter.
	Backoff     time.Duration
	MaxBackoff  time.Duration
	StableAfter time.Duration
	// ProbeDeadline bounds how long one start may take to answer its first probe.
	ProbeDeadline time.Duration
	// EarlyExits is how many starts a never-admitted candidate gets before it is failed.
	EarlyExits int
	// StopGrace is how long a stopping process gets between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// LivenessPeriod is how often a Ready incarnation is probed (default 5s), and LivenessTimeout
	// how long one probe may take (default 2s).
	LivenessPeriod  time.Duration
	LivenessTimeout time.Duration
	// SubrequestLimit caps each incarnation's concurrent subrequests (default
	// egress.DefaultSubrequestLimit).
	SubrequestLimit int
	// Local is the node's edge, to which the egress proxy hands subrequests for hostnames it
	// serves; nil routes none in-process.
	Local egress.Local
	// Bindings serves the requests a worker sends through its service bindings (nil: a worker
	// with bindings reaches nothing through them).
	Bindings BindingRouter
	// Changed is called (without locks held) whenever an incarnation's state changes.
	Changed func(*Incarnation)
	// Restarted is called for every restart, for metrics.
	Restarted func(*Incarnation)
}

func (o *Options) defaults() {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Backoff <= 0 {
		o.Backoff = 250 * time.Millisecond
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = 30 * time.Second
	}
	if o.StableAfter <= 0 {
		o.StableAfter = time.Minute
	}
	if o.ProbeDeadline <= 0 {
		o.ProbeDeadline = 30 * time.Second
	}
	if o.EarlyExits <= 0 {
		o.EarlyExits = 3
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.LivenessPeriod <= 0 {
		o.LivenessPeriod = 5 * time.Second
	}
	if o.LivenessTimeout <= 0 {
		o.LivenessTimeout = 2 * time.Second
	}
}

// BindingRouter serves a request that incarnation from sent through its service binding named
// binding (from.Callee(binding) is the worker it names). Which binding it was is known from the
// socket it arrived on, one per binding and incarnation, never from anything in the request.
type BindingRouter interface {
	ServeBinding(w http.ResponseWriter, r *http.Request, from *Incarnation, binding string)
}

// Spec is what one incarnation runs. Its ID is the identity continuity preserves: the exact bundle
// and config digests (secrets by keyed digest).
type Spec struct {
	ID     string
	Script string
	// Dir is the incarnation's private directory (created 0700; removed when it stops).
	Dir string
	// Files are written 0600 into Dir: the config and the modules it embeds.
	Files map[string][]byte
	// Env is workerd's whole environment: the secret bindings its config reads with
	// fromEnvironment. It is never logged.
	Env []string
	// Lines is the output-line budget of the tenant the incarnation belongs to, shared with its
	// other incarnations; nil gives the incarnation one of its own.
	Lines *LineBudget
	// Scrub lists values removed from workerd's output before it is logged or buffered.
	Scrub []string
	// Log is the worker's log ring: its console.* lines and uncaught exceptions enter it, scrubbed
	// and rate-limited (nil: none is kept).
	Log *workerlog.Ring
	// UID is the sandbox uid of the script's organization (unused without a sandbox).
	UID int
	// Admitted: the incarnation has served before, so continuity keeps it alive.
	Admitted bool
	// Braked reports whether the lifecycle brake holds this incarnation's restarts.
	Braked func() bool
	// MemoryBytes is its memory ceiling in the sandbox (0: the node's).
	MemoryBytes int64
	// Callees are its service bindings, the worker UID each name binds to. Each name gets a
	// loopback address of its own, the external service workerd.BindingService(name) of its
	// config; the UIDs may change in place (SetCallees).
	Callees map[string]string
}

// Status is a snapshot of an incarnation.
type Status struct {
	State           string
	Reason          string
	Message         string
	Restarts        int
	Incident        bool
	IncidentMessage string
	PID             int
	Address         string
}

// Incarnation is one supervised workerd identity.
type Incarnation struct {
	spec Spec
	opts Options
	// The sockets the supervisor opens and hands to workerd: the user's worker (listener), the
	// probe and the outbound socket of the egress path; and the egress proxy's own.
	listener *net.TCPListener
	probeL   *net.TCPListener
	outL     *net.TCPListener
	egressL  *net.TCPListener
	egress   *http.Server
	proxy    *egress.Proxy
	// bindings are the listeners of its service bindings, by binding name, and their servers.
	bindings map[string]*net.TCPListener
	bindSrv  []*http.Server
	callees  atomic.Pointer[map[string]string]
	addr     string
	log      *slog.Logger

	mu       sync.Mutex
	status   Status
	restarts []time.Time
	admitted bool

	// lines rate-limits its output across every start of its process, when its Spec names no
	// tenant's budget.
	lines LineBudget

	ready    atomic.Bool  // mirrors status.State == ready, for the edge's hot path
	wall     atomic.Int64 // the worker's own wall-time limit per request (ns); 0: the edge's
	inflight atomic.Int64
	answered atomic.Int64
	retired  atomic.Bool

	stopOnce sync.Once
	stop     chan struct{}
	wake     chan struct{}
	done     chan struct{}
}

// Start prepares the incarnation's directory and socket and starts supervising it.
func Start(spec Spec, opts Options) (*Incarnation, error) {
	opts.defaults()
	owner := safedir.Current()
	if err := safedir.Ensure(spec.Dir, owner); err != nil {
		return nil, err
	}
	fail := func(err error) (*Incarnation, error) {
		_ = os.RemoveAll(spec.Dir)
		return nil, err
	}
	for name, data := range spec.Files {
		if err := safedir.WriteFile(spec.Dir, name, data, owner); err != nil {
			return fail(err)
		}
	}
	// The supervisor owns the sockets: workerd serves the descriptors it is handed, so a restart
	// keeps the same ports and no other process can take them in between.
	var ls [4]*net.TCPListener
	for n := range ls {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			for _, open := range ls[:n] {
				open.Close()
			}
			return fail(fmt.Errorf("open a loopback socket for incarnation %s: %w", spec.ID, err))
		}
		ls[n] = l
	}
	inc := &Incarnation{
		spec: spec, opts: opts, listener: ls[0], probeL: ls[1], outL: ls[2], egressL: ls[3], addr: ls[0].Addr().String(),
		log:  opts.Logger.With("script", spec.Script, "incarnation", spec.ID),
		stop: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{}),
		admitted: spec.Admitted,
	}
	inc.SetCallees(spec.Callees)
	inc.proxy = egress.NewProxy(inc.outL.Addr().String(), opts.SubrequestLimit, opts.Local)
	inc.proxy.Caller = spec.Script
	inc.egress = inc.serve(inc.egressL, inc.proxy)
	inc.bindings = make(map[string]*net.TCPListener, len(spec.Callees))
	for _, name := range slices.Sorted(maps.Keys(spec.Callees)) {
		l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			inc.closeListeners()
			_ = inc.egress.Close()
			for _, open := range ls {
				open.Close()
			}
			return fail(fmt.Errorf("open a loopback socket for a service binding of incarnation %s: %w", spec.ID, err))
		}
		inc.bindings[name] = l
		binding := name
		// A binding call is a subrequest of the worker like a fetch(): the same cap admits it.
		inc.bindSrv = append(inc.bindSrv, inc.serve(l, inc.proxy.Admitted(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if opts.Bindings == nil {
				http.Error(w, "service bindings are not served on this node", http.StatusServiceUnavailable)
				return
			}
			opts.Bindings.ServeBinding(w, r, inc, binding)
		}))))
	}
	inc.status = Status{State: adminapi.StatePending, Reason: adminapi.ReasonPending, Message: "starting workerd", Address: inc.addr}
	go inc.run()
	return inc, nil
}

// ID is the incarnation's identity.
func (i *Incarnation) ID() string { return i.spec.ID }

// Script is the script it runs.
func (i *Incarnation) Script() string { return i.spec.Script }

// Addr is its loopback socket's address.
func (i *Incarnation) Addr() string { return i.addr }

// ProbeAddr is the address of its built-in probe.
func (i *Incarnation) ProbeAddr() string { return i.probeL.Addr().String() }

// Subrequests is the number of its subrequests in flight, and how many the cap refused.
func (i *Incarnation) Subrequests() (inFlight, refused int64) {
	return i.proxy.InFlight(), i.proxy.Refused()
}

// Status returns a snapshot.
func (i *Incarnation) Status() Status {
	i.mu.Lock()
	defer i.mu.Unlock()
	s := i.status
	s.Incident, s.IncidentMessage = i.incidentLocked(time.Now())
	return s
}

// Ready reports whether both witnesses hold now.
func (i *Incarnation) Ready() bool { return i.ready.Load() }

// Admit marks the incarnation as having served: from now on continuity keeps it alive.
func (i *Incarnation) Admit() {
	i.mu.Lock()
	i.admitted = true
	i.mu.Unlock()
}

// Wake makes a restart held by the lifecycle brake look again at once (the brake was released).
func (i *Incarnation) Wake() {
	select {
	case i.wake <- struct{}{}:
	default:
	}
}

// Acquire counts one request in flight, unless the incarnation is retired (draining or stopped), in
// which case the caller must look up the script's current incarnation again. The count is taken
// before the check, so a drain that saw zero can never miss a request that got through.
func (i *Incarnation) Acquire() bool {
	i.inflight.Add(1)
	if i.retired.Load() {
		i.inflight.Add(-1)
		return false
	}
	return true
}

// Release ends a request counted by Acquire.
func (i *Incarnation) Release() { i.inflight.Add(-1) }

// Answered counts a response the worker began: liveness takes it as a witness that the process
// is not stuck, however late its probes are answered under load.
func (i *Incarnation) Answered() { i.answered.Add(1) }

// InFlight is the number of requests being served.
func (i *Incarnation) InFlight() int64 { return i.inflight.Load() }

// Drain retires the incarnation, waits (up to timeout) for its requests in flight to finish, and
// stops it.
func (i *Incarnation) Drain(timeout time.Duration) {
	i.retired.Store(true)
	deadline := time.Now().Add(timeout)
	for i.inflight.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := i.inflight.Load(); n > 0 {
		i.log.Warn("drain deadline passed with requests in flight", "inFlight", n)
	}
	i.Stop()
}

// Stop ends the process and removes the directory; it returns once both are done.
func (i *Incarnation) Stop() {
	i.retired.Store(true)
	i.stopOnce.Do(func() { close(i.stop) })
	<-i.done
}

// Done is closed once the incarnation has stopped for good (stopped, or failed).
func (i *Incarnation) Done() <-chan struct{} { return i.done }

func (i *Incarnation) set(mutate func(s *Status)) {
	i.mu.Lock()
	before := i.status
	mutate(&i.status)
	i.ready.Store(i.status.State == adminapi.StateReady)
	changed := before != i.status
	i.mu.Unlock()
	if changed && i.opts.Changed != nil {
		i.opts.Changed(i)
	}
}

func (i *Incarnation) incidentLocked(now time.Time) (bool, string) {
	n := 0
	for _, t := range i.restarts {
		if now.Sub(t) < IncidentWindow {
			n++
		}
	}
	if n < IncidentRestarts {
		return false, ""
	}
	return true, fmt.Sprintf("restarted %d times within an hour; retries continue", n)
}

func (i *Incarnation) isAdmitted() bool {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.admitted
}

func (i *Incarnation) run() {
	defer func() {
		i.cleanup()
		close(i.done)
		// Whoever waits on the outcome looks again now that it is final.
		if i.opts.Changed != nil {
			i.opts.Changed(i)
		}
	}()
	backoff := i.opts.Backoff
	earlyExits := 0
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if !i.waitToRestart(backoff) {
				return
			}
			backoff = min(2*backoff, i.opts.MaxBackoff)
		}
		outcome := i.runOnce()
		switch {
		case outcome.stopped:
			return
		case outcome.stable:
			backoff = i.opts.Backoff
		}
		if !outcome.wasReady && !i.isAdmitted() {
			earlyExits++
			if earlyExits >= i.opts.EarlyExits || outcome.deadline {
				i.set(func(s *Status) {
					s.State, s.Reason, s.PID = adminapi.StateFailed, adminapi.ReasonFailed, 0
					s.Message = fmt.Sprintf("workerd never became ready after %d start(s): %s", earlyExits, outcome.why)
				})
				i.log.Warn("incarnation failed", "reason", outcome.why)
				return
			}
		}
		reason := adminapi.ReasonRestarting
		if outcome.reason != "" {
			reason = outcome.reason
		}
		// One change, so that the count alone (a start that fails as the last did) still
		// tells whoever watches the status.
		i.set(func(s *Status) {
			i.restarts = append(i.restarts, time.Now())
			s.Restarts++
			s.State, s.Reason, s.PID = adminapi.StatePending, reason, 0
			s.Message = fmt.Sprintf("%s; restarting in %s", outcome.why, backoff)
		})
		if i.opts.Restarted != nil {
			i.opts.Restarted(i)
		}
	}
}

// waitToRestart sleeps the backoff and then waits while the lifecycle brake holds this admitted
// incarnation. It reports false when the incarnation is being stopped.
func (i *Incarnation) waitToRestart(backoff time.Duration) bool {
	t := time.NewTimer(backoff)
	defer t.Stop()
	select {
	case <-i.stop:
		return false
	case <-t.C:
	}
	for i.isAdmitted() && i.spec.Braked != nil && i.spec.Braked() {
		i.set(func(s *Status) {
			s.State, s.Reason, s.PID = adminapi.StatePending, adminapi.ReasonBraked, 0
			s.Message = "the lifecycle brake holds restarts of this incarnation"
		})
		select {
		case <-i.stop:
			return false
		case <-i.wake:
		case <-time.After(time.Second):
		}
	}
	return true
}

type outcome struct {
	stopped  bool   // the supervisor stopped it
	wasReady bool   // it answered a probe before it ended
	stable   bool   // it stayed up long enough to start the backoff over
	deadline bool   // its probe deadline passed
	reason   string // the status reason while it restarts, when not ReasonRestarting
	why      string // what ended it, for the status message (never output of the worker)
}

func (i *Incarnation) runOnce() outcome {
	sockets, socketArgs, err := i.socketFiles()
	if err != nil {
		return outcome{why: fmt.Sprintf("cannot hand the sockets to workerd: %v", err)}
	}
	defer closeAll(sockets)
	lines := i.spec.Lines
	if lines == nil {
		lines = &i.lines
	}
	tail := &tailWriter{log: i.log, scrub: scrubForms(i.spec.Scrub), bucket: lines, ring: i.spec.Log, incarnation: i.spec.ID}
	proc, err := i.startProcess(sockets, socketArgs, tail)
	if err != nil {
		return outcome{why: fmt.Sprintf("workerd did not start: %v", err)}
	}
	started := time.Now()
	// First witness: the process is running.
	i.set(func(s *Status) {
		s.PID = proc.Pid()
		if s.State != adminapi.StateReady {
			s.State, s.Reason, s.Message = adminapi.StatePending, adminapi.ReasonPending, "workerd is running; waiting for its probe to be answered"
		}
	})
	i.log.Info("workerd started", "pid", proc.Pid(), "address", i.addr, "sandboxed", i.opts.Sandbox != nil)
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()

	if res := i.probeUntilReady(exited); res != nil {
		if !res.stopped && res.why != "" {
			// Output from before the first answer is workerd's own (config or module evaluation
			// errors): ES module code only sees its bindings inside a handler. It is scrubbed anyway.
			if d := tail.Diagnosis(); d != "" {
				res.why += "; workerd said: " + d
			}
			i.log.Warn("workerd did not become ready", "reason", res.why)
		}
		return *res
	}
	i.set(func(s *Status) {
		s.State, s.Reason, s.Message = adminapi.StateReady, adminapi.ReasonReady, ""
	})
	i.log.Info("incarnation ready", "pid", proc.Pid(), "after", time.Since(started).Round(time.Millisecond).String())
	return i.watch(exited, started, tail, proc)
}

// socketFiles returns the descriptors handed to workerd (fds 3, 4 and 5 in the child) and the
// arguments that name them and the egress proxy's address.
func (i *Incarnation) socketFiles() ([]*os.File, []string, error) {
	var files []*os.File
	var args []string
	for _, s := range []struct {
		name string
		l    *net.TCPListener
	}{{SocketName, i.listener}, {workerd.ProbeSocket, i.probeL}, {workerd.OutboundSocket, i.outL}} {
		f, err := s.l.File()
		if err != nil {
			closeAll(files)
			return nil, nil, err
		}
		args = append(args, "--socket-fd", fmt.Sprintf("%s=%d", s.name, 3+len(files)))
		files = append(files, f)
	}
	args = append(args, "--external-addr", workerd.EgressService+"="+i.egressL.Addr().String())
	for _, name := range slices.Sorted(maps.Keys(i.spec.Callees)) {
		args = append(args, "--external-addr", workerd.BindingService(name)+"="+i.bindings[name].Addr().String())
	}
	return files, args, nil
}

// SetWallLimit sets the worker's own wall-time limit per request (0: the edge's). It changes
// with the worker's limits, not its code, so the running incarnation takes it in place.
func (i *Incarnation) SetWallLimit(d time.Duration) { i.wall.Store(int64(d)) }

// WallLimit implements edge.WallLimited.
func (i *Incarnation) WallLimit() time.Duration { return time.Duration(i.wall.Load()) }

// SetCallees sets the worker UID each of its service bindings names (the names are fixed at
// Start: each has its socket). A binding to another worker changes the worker's settings, not its
// code, so the running incarnation takes it in place.
func (i *Incarnation) SetCallees(callees map[string]string) {
	m := maps.Clone(callees)
	i.callees.Store(&m)
}

// Callee is the worker UID its service binding named binding names now ("" for none).
func (i *Incarnation) Callee(binding string) string {
	if m := i.callees.Load(); m != nil {
		return (*m)[binding]
	}
	return ""
}

// serve serves h on one of the incarnation's loopback sockets (its egress proxy's, a service
// binding's) until the server is closed.
func (i *Incarnation) serve(l *net.TCPListener, h http.Handler) *http.Server {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(i.log.Handler(), slog.LevelWarn)}
	go func() { _ = srv.Serve(l) }()
	return srv
}

// closeListeners closes the service bindings' listeners and servers.
func (i *Incarnation) closeListeners() {
	for _, srv := range i.bindSrv {
		_ = srv.Close()
	}
	for _, l := range i.bindings {
		_ = l.Close()
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// watch keeps a Ready process under watch until it exits, is stopped, or misses LivenessMisses
// probes in a row; then it is killed (SIGKILL: a looping workerd does not act on SIGTERM) and its
// requests in flight end with the connection.
func (i *Incarnation) watch(exited chan error, started time.Time, tail *tailWriter, proc process) outcome {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: i.opts.LivenessTimeout}
	defer client.CloseIdleConnections()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tick := time.NewTicker(i.opts.LivenessPeriod)
	defer tick.Stop()
	answers := make(chan probeResult, 1)
	probing, misses := false, 0
	lastTick := i.answered.Load()
	for {
		select {
		case err := <-exited:
			why := "workerd exited: " + exitText(err)
			if hit := proc.LimitHit(); hit != "" {
				// A ceiling ended it: continuity restarts it, and the restart counts toward an
				// incident.
				why += " (" + hit + ")"
			}
			i.log.Warn("workerd exited", "error", why, "output", tail.Tail())
			return outcome{wasReady: true, stable: time.Since(started) >= i.opts.StableAfter, why: why}
		case <-i.stop:
			i.terminateWaiting(exited)
			i.log.Info("workerd stopped")
			return outcome{stopped: true}
		case <-tick.C:
			// What the worker answered since the last tick is this period's witness.
			before := lastTick
			lastTick = i.answered.Load()
			if !probing {
				probing = true
				go func() { answers <- probeResult{ok: i.probe(ctx, client), before: before} }()
			}
		case a := <-answers:
			probing = false
			if a.ok {
				misses = 0
				continue
			}
			if i.answered.Load() != a.before {
				// The probe came late, but the worker answered requests in the last period: busy,
				// not stuck (a worker in a loop answers nothing).
				misses = 0
				i.log.Debug("liveness probe late while the worker answers requests")
				continue
			}
			misses++
			i.log.Warn("liveness probe missed", "misses", misses)
			if misses < LivenessMisses {
				continue
			}
			why := fmt.Sprintf("missed %d liveness probes in a row (every %s, each allowed %s): the worker holds workerd's thread", misses, i.opts.LivenessPeriod, i.opts.LivenessTimeout)
			i.set(func(s *Status) {
				s.State, s.Reason, s.Message = adminapi.StatePending, adminapi.ReasonUnresponsive, why+"; killing it"
			})
			i.killWaiting(exited)
			i.log.Warn("workerd killed: unresponsive", "misses", misses)
			return outcome{wasReady: true, stable: time.Since(started) >= i.opts.StableAfter, reason: adminapi.ReasonUnresponsive, why: why}
		}
	}
}

// probeResult is one liveness probe's answer, and the worker's answer count one period before.
type probeResult struct {
	ok     bool
	before int64
}

// probeUntilReady probes the socket until it answers (second witness), the process exits, the
// deadline passes or the incarnation is stopped. A nil outcome means Ready.
func (i *Incarnation) probeUntilReady(exited chan error) *outcome {
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	defer client.CloseIdleConnections()
	deadline := time.NewTimer(i.opts.ProbeDeadline)
	defer deadline.Stop()
	answered := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if i.probe(ctx, client) {
				answered <- struct{}{}
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(25 * time.Millisecond):
			}
		}
	}()
	select {
	case <-answered:
		return nil
	case err := <-exited:
		return &outcome{why: "workerd exited before answering its probe: " + exitText(err)}
	case <-i.stop:
		i.terminateWaiting(exited)
		return &outcome{stopped: true}
	case <-deadline.C:
		// Kill and collect this start; the caller decides whether to try again.
		i.killWaiting(exited)
		return &outcome{deadline: true, why: fmt.Sprintf("no probe answered within %s", i.opts.ProbeDeadline)}
	}
}

func (i *Incarnation) pid() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.status.PID
}

func (i *Incarnation) killWaiting(exited chan error) {
	if pid := i.pid(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	<-exited
}

func (i *Incarnation) terminateWaiting(exited chan error) {
	if pid := i.pid(); pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	select {
	case <-exited:
	case <-time.After(i.opts.StopGrace):
		i.killWaiting(exited)
	}
}

// probe asks the built-in probe (the runtime's dialer worker), never the user's: it answers ProbeReply.
func (i *Incarnation) probe(ctx context.Context, client *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+i.ProbeAddr()+"/", nil)
	if err != nil {
		return false
	}
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	return err == nil && resp.StatusCode == http.StatusOK && string(body) == workerd.ProbeReply
}

func (i *Incarnation) cleanup() {
	i.retired.Store(true)
	_ = i.egress.Close()
	i.closeListeners()
	for _, l := range []*net.TCPListener{i.listener, i.probeL, i.outL} {
		_ = l.Close()
	}
	if err := os.RemoveAll(i.spec.Dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		i.log.Error("remove incarnation directory", "error", err)
	}
	i.set(func(s *Status) {
		s.PID = 0
		if s.State != adminapi.StateFailed {
			s.State, s.Reason, s.Message = adminapi.StatePending, adminapi.ReasonPending, "stopped"
		}
	})
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// tailWriter logs workerd's output line by line, with every delivered value scrubbed out (a worker
// could print one), and keeps the last lines for diagnostics. Lines are rate-limited (SPEC 5.1: one
// tenant's worker must not flood the node's log): a token bucket of OutputLinesPerSecond with a
// burst of OutputLineBurst; lines over it are dropped unread and counted, and the count is logged
// in one summary line a second after the first drop. The worker's own lines (console.* and
// uncaught exceptions, see workerlog.Parse) also enter its log ring, scrubbed first, through the
// ring's own per-worker rate limit.
type tailWriter struct {
	log   *slog.Logger
	scrub []string
	mu    sync.Mutex
	buf   []byte
	tail  []string
	// skipping: the current line was over long and is dropped up to its end.
	skipping bool

	// now is the clock of the rate limit (tests move it); nil is time.Now.
	now func() time.Time
	// bucket is the tenant's (Spec.Lines), or the incarnation's, kept across its process starts: a
	// worker that crashes on purpose gets no fresh burst per restart.
	bucket  *LineBudget
	dropped int
	report  *time.Timer

	// ring is the worker's log (nil: none), and incarnation what its entries name.
	ring        *workerlog.Ring
	incarnation string
}

// The rate limit of one workerd process's output lines.
const (
	OutputLinesPerSecond = 100
	OutputLineBurst      = 200
	// droppedReportAfter is how long after the first dropped line its summary is logged.
	droppedReportAfter = time.Second
)

// LineBudget is the output lines one tenant's incarnations may log together (SPEC 5.1: a tenant's
// log lines are rate-limited, however many workers it runs): a token bucket of
// OutputLinesPerSecond with a burst of OutputLineBurst, shared by every incarnation given it.
type LineBudget struct {
	mu sync.Mutex
	b  lineBucket
}

func (l *LineBudget) take(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.take(now)
}

// lineBucket is a token bucket of output lines, full at its first use.
type lineBucket struct {
	tokens float64
	last   time.Time
}

func (b *lineBucket) take(now time.Time) bool {
	if b.last.IsZero() {
		b.tokens = OutputLineBurst
	} else if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(OutputLineBurst, b.tokens+elapsed*OutputLinesPerSecond)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// admit takes one line from the bucket (w.mu held); a refused line is counted, and the first one
// of a run arms the summary.
func (w *tailWriter) admit() bool {
	now := time.Now
	if w.now != nil {
		now = w.now
	}
	if w.bucket == nil {
		w.bucket = &LineBudget{}
	}
	if w.bucket.take(now()) {
		return true
	}
	w.dropped++
	if w.report == nil {
		w.report = time.AfterFunc(droppedReportAfter, w.reportDropped)
	}
	return false
}

// reportDropped logs how many lines the rate limit dropped since the last summary.
func (w *tailWriter) reportDropped() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.report = nil
	if w.dropped == 0 {
		return
	}
	w.log.Warn("workerd output lines dropped: over the rate limit", "dropped", w.dropped,
		"limit", fmt.Sprintf("%d lines/s, burst %d", OutputLinesPerSecond, OutputLineBurst))
	w.keep(fmt.Sprintf("[%d lines dropped: over the rate limit]", w.dropped))
	w.dropped = 0
}

func (w *tailWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		n := bytes.IndexByte(w.buf, '\n')
		if n < 0 {
			break
		}
		if !w.skipping {
			w.line(string(w.buf[:n]))
		}
		w.skipping = false
		w.buf = w.buf[n+1:]
	}
	if len(w.buf) > maxOutputLine || (w.skipping && len(w.buf) > 0) {
		// Cutting the line could split a value between two pieces that are each scrubbed clean:
		// an over-long line is dropped to its end instead, never logged in part.
		if !w.skipping && w.admit() {
			w.log.Warn("workerd output line omitted: over 64 KiB")
		}
		if !w.skipping && w.ring != nil && w.ring.Admit() {
			w.ring.Append(w.incarnation, adminapi.LevelWarn, "[a line of output over 64 KiB was omitted]")
		}
		w.skipping = true
		w.buf = w.buf[:0]
	}
	return len(p), nil
}

// maxOutputLine bounds one line of workerd's output kept in memory.
const maxOutputLine = 64 << 10

// minScrubPiece is the shortest line of a multi-line value scrubbed on its own (shorter ones, such
// as a blank line, would redact ordinary output for nothing).
const minScrubPiece = 6

// scrubForms lists what to remove from output for values: each value as it is, as JSON writes it
// inside a string (JSON.stringify of env or of an object holding it), each line of a multi-line
// value (a PEM key printed line by line), and its encoded forms (encodedForms). Longest first, so
// that a longer form is removed before a piece of it.
func scrubForms(values []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(v string) {
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	for _, v := range values {
		add(v)
		if raw, err := json.Marshal(v); err == nil {
			add(string(raw[1 : len(raw)-1]))
		}
		if strings.ContainsAny(v, "\r\n") {
			for _, piece := range strings.FieldsFunc(v, func(r rune) bool { return r == '\n' || r == '\r' }) {
				if len(strings.TrimSpace(piece)) >= minScrubPiece {
					add(piece)
				}
			}
		}
		for _, form := range encodedForms(v) {
			if len(form) >= minScrubPiece {
				add(form)
			}
		}
	}
	sort.Slice(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
	return out
}

// encodedForms lists how a worker can print v without printing it: btoa(v) and base64url, padded
// and not, lower- and upper-case hex, and, for v inside a longer base64 string (btoa(prefix + v)),
// the run of base64 characters that v alone decides at each of the three byte alignments. What
// stays of such a string is at most one character at each end of v that mixes its first or last
// bits with its neighbours'.
func encodedForms(v string) []string {
	b := []byte(v)
	forms := []string{
		base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
	}
	for offset := range 3 {
		shifted := base64.RawStdEncoding.EncodeToString(append(make([]byte, offset), b...))
		// Character i covers bits 6i..6i+5 of the shifted bytes; v's bits are 8*offset..8*(offset+len).
		first, end := (8*offset+5)/6, 8*(offset+len(b))/6
		if first >= end {
			continue
		}
		run := shifted[first:end]
		forms = append(forms, run, strings.NewReplacer("+", "-", "/", "_").Replace(run))
	}
	return forms
}

func (w *tailWriter) line(raw string) {
	if strings.TrimSpace(raw) == "" {
		return
	}
	parsed := workerlog.Parse(raw)
	toLog := w.admit()
	toRing := parsed.Worker && w.ring != nil && w.ring.Admit()
	if !toLog && !toRing {
		return
	}
	// Scrubbed before it goes anywhere: the ring never holds a value in any form. A structured
	// line is scrubbed in its decoded text, which is what the worker printed.
	s := w.scrubbed(parsed.Message)
	if toRing {
		w.ring.Append(w.incarnation, parsed.Level, s)
	}
	if !toLog {
		return
	}
	if parsed.Structured {
		w.log.Info("workerd output", "line", s, "level", parsed.Level)
	} else {
		w.log.Info("workerd output", "line", s)
	}
	// Each line of a multi-line message is kept on its own, so that Diagnosis finds an
	// exception's "at file:line" lines after it.
	for _, piece := range strings.Split(s, "\n") {
		if strings.TrimSpace(piece) != "" {
			w.keep(piece)
		}
	}
}

// scrubbed removes every form of every delivered value from s.
func (w *tailWriter) scrubbed(s string) string {
	for _, v := range w.scrub {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	return s
}

// keep remembers a logged line for Tail (w.mu held).
func (w *tailWriter) keep(s string) {
	w.tail = append(w.tail, s)
	if len(w.tail) > tailLines {
		w.tail = w.tail[1:]
	}
}

// tailLines is how many of the last lines of output are kept for diagnostics.
const tailLines = 20

// notable marks a line of workerd's output that says what went wrong: an uncaught exception in the
// script's top level, a syntax or reference error, or workerd's own error lines.
var notable = regexp.MustCompile(`(?i)uncaught|error|exception|failed|not found|no such`)

// Diagnosis picks from the kept output the lines that explain a failed start (SPEC 5: a deploy
// failure carries workerd's actual error): each notable line with the "at file:line" lines that
// follow it, at most four lines; else the last line. Lines are scrubbed already.
func (w *tailWriter) Diagnosis() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var picked []string
	for n := 0; n < len(w.tail) && len(picked) < 4; n++ {
		if !notable.MatchString(w.tail[n]) {
			continue
		}
		picked = append(picked, strings.TrimSpace(w.tail[n]))
		for n+1 < len(w.tail) && len(picked) < 4 && strings.HasPrefix(strings.TrimSpace(w.tail[n+1]), "at ") {
			n++
			picked = append(picked, strings.TrimSpace(w.tail[n]))
		}
	}
	if len(picked) == 0 && len(w.tail) > 0 {
		picked = []string{strings.TrimSpace(w.tail[len(w.tail)-1])}
	}
	out := strings.Join(picked, " / ")
	if len(out) > 600 {
		out = out[:600] + "…"
	}
	return out
}

// Tail returns the last lines, scrubbed.
func (w *tailWriter) Tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.tail, "\n")
}
