// Package supervisor runs incarnations: one workerd process each, on a loopback socket the
// supervisor opens and hands to workerd, with a generated config in a private directory.
//
// An incarnation is Ready on two witnesses (SPEC 5, seed 004): the supervisor observed its process
// running (started and not exited), and a probe on its socket was answered with an HTTP response.
// A process that dies is restarted as the same incarnation (same files, same socket, same
// environment) with capped exponential backoff; nothing about it is rebuilt. A candidate that has
// never been admitted gives up after a few early exits or when its probe deadline passes (failed,
// RuntimeFailed); an admitted incarnation is retried for as long as it is wanted, and six restarts
// within an hour raise an incident while retries continue. The lifecycle brake holds restarts.
package supervisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
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
	// ProbeHeader marks the supervisor's readiness probe, for workers that want to tell it apart.
	ProbeHeader = "Takoform-Probe"
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
	// Scrub lists values removed from workerd's output before it is logged.
	Scrub []string
	// UID is the sandbox uid of the script's organization (unused without a sandbox).
	UID int
	// Admitted: the incarnation has served before, so continuity keeps it alive.
	Admitted bool
	// Braked reports whether the lifecycle brake holds this incarnation's restarts.
	Braked func() bool
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
	spec     Spec
	opts     Options
	listener *net.TCPListener
	addr     string
	log      *slog.Logger

	mu       sync.Mutex
	status   Status
	restarts []time.Time
	admitted bool

	ready    atomic.Bool // mirrors status.State == ready, for the edge's hot path
	inflight atomic.Int64
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
	// The supervisor owns the socket: workerd serves the descriptor it is handed, so a restart keeps
	// the same port and no other process can take it in between.
	l, err := net.ListenTCP("tcp", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return fail(fmt.Errorf("open a loopback socket for incarnation %s: %w", spec.ID, err))
	}
	inc := &Incarnation{
		spec: spec, opts: opts, listener: l, addr: l.Addr().String(),
		log:  opts.Logger.With("script", spec.Script, "incarnation", spec.ID),
		stop: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{}),
		admitted: spec.Admitted,
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
		i.mu.Lock()
		i.restarts = append(i.restarts, time.Now())
		i.status.Restarts++
		i.mu.Unlock()
		if i.opts.Restarted != nil {
			i.opts.Restarted(i)
		}
		i.set(func(s *Status) {
			s.State, s.Reason, s.PID = adminapi.StatePending, adminapi.ReasonRestarting, 0
			s.Message = fmt.Sprintf("%s; restarting in %s", outcome.why, backoff)
		})
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
	why      string // what ended it, for the status message (never output of the worker)
}

func (i *Incarnation) runOnce() outcome {
	socket, err := i.listener.File()
	if err != nil {
		return outcome{why: fmt.Sprintf("cannot hand the socket to workerd: %v", err)}
	}
	defer socket.Close()
	tail := &tailWriter{log: i.log, scrub: scrubForms(i.spec.Scrub)}
	proc, err := i.startProcess([]*os.File{socket}, []string{"--socket-fd", fmt.Sprintf("%s=3", SocketName)}, tail)
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
			if t := tail.Tail(); t != "" {
				res.why += "; last output: " + lastLine(t)
			}
			i.log.Warn("workerd did not become ready", "reason", res.why)
		}
		return *res
	}
	i.set(func(s *Status) {
		s.State, s.Reason, s.Message = adminapi.StateReady, adminapi.ReasonReady, ""
	})
	i.log.Info("incarnation ready", "pid", proc.Pid(), "after", time.Since(started).Round(time.Millisecond).String())
	select {
	case err := <-exited:
		why := "workerd exited: " + exitText(err)
		if hit := proc.LimitHit(); hit != "" {
			// A ceiling ended it: continuity restarts it, and the restart counts toward an incident.
			why += " (" + hit + ")"
		}
		i.log.Warn("workerd exited", "error", why, "output", tail.Tail())
		return outcome{wasReady: true, stable: time.Since(started) >= i.opts.StableAfter, why: why}
	case <-i.stop:
		i.terminateWaiting(exited)
		i.log.Info("workerd stopped")
		return outcome{stopped: true}
	}
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

func (i *Incarnation) probe(ctx context.Context, client *http.Client) bool {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+i.addr+"/", nil)
	if err != nil {
		return false
	}
	req.Header.Set(ProbeHeader, "1")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return true
}

func (i *Incarnation) cleanup() {
	i.retired.Store(true)
	_ = i.listener.Close()
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

func lastLine(s string) string {
	if n := strings.LastIndexByte(s, '\n'); n >= 0 {
		s = s[n+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// tailWriter logs workerd's output line by line, with every delivered value scrubbed out (a worker
// could print one), and keeps the last lines for diagnostics.
type tailWriter struct {
	log   *slog.Logger
	scrub []string
	mu    sync.Mutex
	buf   []byte
	tail  []string
	// skipping: the current line was over long and is dropped up to its end.
	skipping bool
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
		if !w.skipping {
			w.log.Warn("workerd output line omitted: over 64 KiB")
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
// inside a string (JSON.stringify of env or of an object holding it), and each line of a
// multi-line value (a PEM key printed line by line). Longest first, so that a longer form is
// removed before a piece of it.
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
	}
	sort.Slice(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
	return out
}

func (w *tailWriter) line(s string) {
	for _, v := range w.scrub {
		if v != "" {
			s = strings.ReplaceAll(s, v, "[redacted]")
		}
	}
	if strings.TrimSpace(s) == "" {
		return
	}
	w.log.Info("workerd output", "line", s)
	w.tail = append(w.tail, s)
	if len(w.tail) > 5 {
		w.tail = w.tail[1:]
	}
}

// Tail returns the last lines, scrubbed.
func (w *tailWriter) Tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.tail, "\n")
}
