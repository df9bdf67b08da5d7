package orgproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/scrub"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// phase is where a process is in its life.
type phase int

const (
	phaseStarting   phase = iota // workerd is starting: no liveness probe answered yet
	phaseRunning                 // it answered a liveness probe since its start (first witness)
	phaseRestarting              // it died, and continuity restarts it after a backoff
	phaseStopped                 // it stopped for good
)

// procState is a snapshot of a process's phase.
type procState struct {
	phase   phase
	reason  string
	message string
	pid     int
}

// Process is one slot of workerd processes: an organization's shared one, or one incarnation's
// alone. Continuity restarts its workerd in place (same sockets, same name); a recycle replaces
// the whole Process with a new one.
type Process struct {
	m    *Manager
	key  procKey
	name string
	uid  int
	log  *slog.Logger
	sock sockets
	// files are its config and router; probeEntrypoint the entrypoint its probes call.
	files           map[string][]byte
	probeEntrypoint string
	client          *http.Client
	// startedStalled: its current workerd started counted stalled, its organization a suspect
	// (only its own run goroutine reads and writes it).
	startedStalled bool

	// answered counts the responses its workers began (a witness of liveness besides the probe).
	answered atomic.Int64
	// lastAnswer is when it last answered anything, a probe or a request (mono).
	lastAnswer atomic.Int64
	// alive is when the process last answered a liveness probe (mono).
	alive atomic.Int64
	// scrubber removes every value any of its incarnations holds from workerd's own output.
	scrubber atomic.Pointer[scrub.Scrubber]
	// probes bounds the probes in flight in it (the process loads on one thread anyway).
	probes chan struct{}
	// budget is its organization's output line budget.
	budget atomic.Pointer[workerlog.Budget]

	mu    sync.Mutex
	st    procState
	units map[string]*unit       // by loader id, retired ones included (their late logs)
	live  map[*Incarnation]*unit // the units not retired
	// retiredLoaded counts retired isolates that still hold memory; secretsRetiredAt is when
	// the first of them that held secrets retired (zero: none since the last recycle).
	retiredLoaded int
	// retiredBytes is the memory the retired isolates are estimated to hold (isolateCost each).
	retiredBytes     int64
	secretsRetiredAt time.Time
	recycling        bool
	stopping         bool
	// failedStarts counts starts in a row that never ran.
	failedStarts int
	current      *sandbox.Process
	recycleTimer *time.Timer

	// calls are the binding calls it runs from isolate to isolate.
	calls calls

	stop     chan struct{}
	stopOnce sync.Once
	wake     chan struct{}
	done     chan struct{}
}

// newProcess prepares a process's sockets and config; run starts it.
func newProcess(m *Manager, key procKey, gen, uid int) (*Process, error) {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	probe := make([]byte, 16)
	_, _ = rand.Read(probe)
	p := &Process{
		m: m, key: key, name: fmt.Sprintf("p%d-%s", gen, hex.EncodeToString(suffix)), uid: uid,
		probeEntrypoint: "takoformProbe_" + hex.EncodeToString(probe),
		probes:          make(chan struct{}, 4),
		units:           map[string]*unit{}, live: map[*Incarnation]*unit{},
		st:   procState{phase: phaseStarting, reason: adminapi.ReasonPending, message: "starting its organization's workerd"},
		stop: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{}),
	}
	p.log = m.log.With("process", p.name, "org", key.org)
	if key.alone != "" {
		p.log = p.log.With("alone", key.alone)
	}
	p.scrubber.Store(&scrub.Scrubber{})
	socketDir := ""
	if m.opts.Sandbox != nil {
		socketDir = sandboxSocketDir
	}
	files, err := workerd.Org{SocketDir: socketDir, ProbeEntrypoint: p.probeEntrypoint, HeapLimitMB: m.opts.HeapLimitMB}.Files()
	if err != nil {
		return nil, err
	}
	p.files = files
	if err := p.openSockets(); err != nil {
		return nil, err
	}
	p.client = &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", p.sock.ingressDial)
		},
		DisableKeepAlives: true,
	}}
	return p, nil
}

// state is a snapshot of the process's phase.
func (p *Process) state() procState {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.st
}

// setState moves the process to st and tells every incarnation in it.
func (p *Process) setState(st procState) {
	p.mu.Lock()
	p.st = st
	p.mu.Unlock()
	p.refreshAll()
}

// anyProbing reports whether a load the runtime asked for is in progress in it.
func (p *Process) anyProbing() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, u := range p.live {
		if u.probing.Load() {
			return true
		}
	}
	return false
}

// refreshAll recomputes the readiness of every incarnation in the process, telling whoever
// watches of each that changed (and of all, when its phase changed: their status did).
func (p *Process) refreshAll() {
	for _, inc := range p.incarnations() {
		inc.refresh()
		p.m.opts.Changed(inc)
	}
}

// incarnations lists the incarnations placed in it.
func (p *Process) incarnations() []*Incarnation {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Collect(maps.Keys(p.live))
}

// place adds inc to the process under a new loader id. current makes it the unit inc serves from;
// probe asks for its probe (at once when the process runs, else once it does). It reports false
// when the process is stopping (the caller starts another).
func (p *Process) place(inc *Incarnation, current, probe bool) (*unit, bool) {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return nil, false
	}
	u := &unit{p: p, inc: inc, attempt: 1, open: map[*flight]struct{}{}}
	u.loaderID = loaderID(inc.spec.ID, u.attempt)
	p.units[u.loaderID] = u
	p.live[inc] = u
	running := p.st.phase == phaseRunning
	p.mu.Unlock()
	p.addScrub(inc.spec.Scrub)
	if inc.spec.Lines != nil {
		p.budget.CompareAndSwap(nil, inc.spec.Lines)
	}
	p.setMemory()
	inc.addUnit(u, current)
	if probe {
		u.probing.Store(true)
		if running {
			go p.probe(u)
		}
	}
	inc.refresh()
	p.m.opts.Changed(inc)
	return u, true
}

func loaderID(id string, attempt int) string { return fmt.Sprintf("%s.%d", id, attempt) }

// retire takes u out of service: its code is never given again, and the process counts its
// isolate as retired memory until it is recycled. A process left with nothing stops.
func (p *Process) retire(u *unit) {
	u.retired.Store(true)
	u.probing.Store(false)
	p.mu.Lock()
	if p.live[u.inc] != u {
		p.mu.Unlock()
		return
	}
	delete(p.live, u.inc)
	if u.loaded.Load() {
		p.retiredLoaded++
		p.retiredBytes += p.m.opts.isolateCost(u.inc)
		if !u.inc.spec.Scrub.Empty() && p.secretsRetiredAt.IsZero() {
			p.secretsRetiredAt = time.Now()
			p.scheduleRecycleLocked(p.m.opts.RecycleSecretsAfter)
		}
	}
	idle := len(p.live) == 0 && !p.recycling
	if idle {
		p.stopping = true
	}
	p.mu.Unlock()
	u.inc.dropUnit(u)
	u.inc.refresh()
	if idle {
		p.m.forget(p)
		p.log.Info("organization process idle: stopping it")
		p.stopOnce.Do(func() { close(p.stop) })
		return
	}
	p.setMemory()
	p.maybeRecycle()
}

// addScrub adds an incarnation's values to what the process's own output is scrubbed of.
func (p *Process) addScrub(s scrub.Scrubber) {
	if s.Empty() {
		return
	}
	for {
		old := p.scrubber.Load()
		merged := old.Merge(s)
		if p.scrubber.CompareAndSwap(old, &merged) {
			return
		}
	}
}

// memoryCeiling is the process's memory ceiling for the isolates it holds (retired ones
// included: workerd never frees them).
func (p *Process) memoryCeilingLocked() int64 {
	o := p.m.opts
	ceiling := o.MemoryBase + p.retiredBytes
	for inc := range p.live {
		ceiling += o.isolateCost(inc)
	}
	return ceiling
}

// isolateCost is the memory an incarnation's isolate is given room for: an idle isolate's, and
// its bundle's share (what the isolate keeps of its code, and what loading it takes at its peak).
func (o *Options) isolateCost(inc *Incarnation) int64 {
	return o.MemoryPerIsolate + o.MemoryPerBundleByte*inc.spec.BundleBytes
}

// setMemory moves the sandbox's memory ceiling to what the process holds now.
func (p *Process) setMemory() {
	p.mu.Lock()
	cur, ceiling := p.current, p.memoryCeilingLocked()
	p.mu.Unlock()
	if cur != nil {
		if err := cur.SetMemory(ceiling); err != nil {
			p.log.Warn("set the process's memory ceiling", "error", err)
		}
	}
}

// wakeUp makes a held restart or reload look at the brakes again. It returns at once: its caller
// may hold what reading the brakes needs.
func (p *Process) wakeUp() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
	go p.releaseHeld()
}

// shutdown stops the process and waits for it.
func (p *Process) shutdown() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	p.stopOnce.Do(func() { close(p.stop) })
	<-p.done
}

// info describes the process.
func (p *Process) info() ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	return ProcessInfo{Name: p.name, Org: p.key.org, Alone: p.key.alone, PID: p.st.pid, Running: p.st.phase == phaseRunning,
		Live: len(p.live), RetiredLoaded: p.retiredLoaded, Recycling: p.recycling, Refused: p.sock.refused.Load()}
}

// ProcessInfo describes one process.
type ProcessInfo struct {
	Name  string
	Org   string
	Alone string // the incarnation it holds alone ("" for the organization's shared process)
	PID   int
	// Running: it answered a liveness probe since it started.
	Running       bool
	Live          int
	RetiredLoaded int
	Recycling     bool
	// Refused counts connections to its sockets refused for their peer's credentials.
	Refused int64
}

// outcome is how one start of workerd ended.
type outcome struct {
	stopped  bool   // the runtime stopped it
	ran      bool   // it answered a liveness probe before it ended
	stable   bool   // it stayed up long enough to start the backoff over
	killed   bool   // liveness killed it
	reason   string // the status reason while it restarts
	why      string // what ended it (never output of a worker)
	limitHit string // the cgroup ceiling it ran into, if any
	// subrequests: when a liveness kill, each incarnation's subrequests at that moment, before
	// the kill ended those in flight.
	subrequests map[*Incarnation][]subrequest
}

// run starts workerd and keeps it running until the process is stopped.
func (p *Process) run() {
	defer p.cleanup()
	backoff := p.m.opts.Backoff
	for attempt := 0; ; attempt++ {
		if attempt > 0 {
			if !p.waitToRestart(backoff) {
				return
			}
			backoff = min(2*backoff, p.m.opts.MaxBackoff)
		}
		out := p.runOnce()
		if out.stopped {
			return
		}
		if out.stable {
			backoff = p.m.opts.Backoff
		}
		p.died(out, backoff)
	}
}

// waitToRestart sleeps the backoff and then waits while a lifecycle brake holds the
// organization's processes down. It reports false when the process is being stopped.
func (p *Process) waitToRestart(backoff time.Duration) bool {
	t := time.NewTimer(backoff)
	defer t.Stop()
	select {
	case <-p.stop:
		return false
	case <-t.C:
	}
	for p.m.opts.BrakedOrg(p.key.org) {
		st := p.state()
		if st.reason != adminapi.ReasonBraked {
			p.setState(procState{phase: phaseRestarting, reason: adminapi.ReasonBraked, message: "the lifecycle brake holds this organization's process down"})
		}
		select {
		case <-p.stop:
			return false
		case <-p.wake:
		case <-time.After(time.Second):
		}
	}
	return true
}

// runOnce runs one start of workerd to its end.
func (p *Process) runOnce() outcome {
	out := newOutput(p)
	proc, err := p.startWorkerd(out)
	if err != nil {
		return outcome{why: fmt.Sprintf("workerd did not start: %v", err)}
	}
	started := time.Now()
	p.mu.Lock()
	p.st = procState{phase: phaseStarting, reason: p.st.reason, message: "workerd is running; waiting for it to answer", pid: proc.Pid()}
	if p.st.reason == "" || p.st.reason == adminapi.ReasonReady {
		p.st.reason = adminapi.ReasonPending
	}
	p.mu.Unlock()
	p.refreshAll()
	p.log.Info("workerd started", "pid", proc.Pid(), "sandboxed", p.m.opts.Sandbox != nil)
	exited := make(chan error, 1)
	go func() { exited <- proc.Wait() }()
	// Whatever binding calls it was running ended with it.
	defer p.calls.endAll()

	if res := p.awaitFirstAnswer(exited, proc); res != nil {
		if !res.stopped && res.why != "" {
			if d := out.Diagnosis(); d != "" {
				res.why += "; workerd said: " + d
			}
			p.log.Warn("workerd did not start", "reason", res.why)
		}
		return *res
	}
	p.mu.Lock()
	p.failedStarts = 0
	p.st = procState{phase: phaseRunning, pid: proc.Pid()}
	pending := []*unit{}
	for _, u := range p.live {
		if u.probing.Load() {
			pending = append(pending, u)
		}
	}
	p.mu.Unlock()
	p.refreshAll()
	for _, u := range pending {
		go p.probe(u)
	}
	p.log.Info("organization process running", "pid", proc.Pid(), "after", time.Since(started).Round(time.Millisecond).String())
	res := p.watch(exited, started, proc)
	if res.why != "" {
		p.log.Warn("workerd ended", "reason", res.why, "output", out.Tail())
	}
	return res
}

// workerdProcess is one start of workerd: sandboxed, or the node's own user's.
type workerdProcess interface {
	Pid() int
	Wait() error
	LimitHit() string
	// SetStalled says whether the process yields the CPU (sandbox.Process.SetStalled), SetHeld
	// whether a worker holds its thread now (sandbox.Process.SetHeld).
	SetStalled(stalled bool) error
	SetHeld(held bool) error
}

// startWorkerd starts workerd on the process's config, handing it the ingress socket as
// descriptor 3.
func (p *Process) startWorkerd(out *output) (workerdProcess, error) {
	ingress, err := p.sock.ingress.File()
	if err != nil {
		return nil, err
	}
	defer ingress.Close()
	args := append(workerd.ServeArgs(), "--socket-fd", workerd.IngressSocket+"=3")
	if sb := p.m.opts.Sandbox; sb != nil {
		p.mu.Lock()
		memory := p.memoryCeilingLocked()
		p.mu.Unlock()
		// An organization killed for a loop lately starts again yielding the CPU: its start and
		// its loads are where a loop asked again at once spends the CPU others want.
		p.startedStalled = p.m.suspect(p.key.org)
		proc, err := sb.Start(sandbox.Program{
			Path: p.m.opts.Workerd, Args: args, Dir: p.sock.confDir, Files: slices.Sorted(maps.Keys(p.files)), Env: []string{},
			UID: p.uid, Name: "proc-" + p.name, MemoryBytes: memory, Stalled: p.startedStalled, ExtraFiles: []*os.File{ingress},
			BindDir: p.sock.dirFD, BindAt: sandboxSocketDir, NoNetwork: true, Stdout: out, Stderr: out,
		})
		if err != nil {
			return nil, err
		}
		p.mu.Lock()
		p.current = proc
		p.mu.Unlock()
		return proc, nil
	}
	args[2] = filepath.Join(p.sock.confDir, workerd.ConfigFile)
	cmd := exec.Command(p.m.opts.Workerd, args...)
	// Without a sandbox the socket paths of the config are relative to its working directory.
	cmd.Dir = p.sock.dir
	cmd.Env = []string{}
	cmd.ExtraFiles = []*os.File{ingress}
	cmd.Stdout, cmd.Stderr = out, out
	// The process dies with the runtime node, and runs in its own process group so a terminal's
	// Ctrl-C reaches only the node, which then stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return unsandboxed{cmd}, nil
}

// unsandboxed is workerd run as the node's own user (--insecure-no-sandbox).
type unsandboxed struct{ cmd *exec.Cmd }

func (u unsandboxed) Pid() int         { return u.cmd.Process.Pid }
func (u unsandboxed) Wait() error      { return u.cmd.Wait() }
func (u unsandboxed) LimitHit() string { return "" }

// SetStalled and SetHeld do nothing: without a sandbox there is no organization's cgroup to
// weigh.
func (u unsandboxed) SetStalled(bool) error { return nil }
func (u unsandboxed) SetHeld(bool) error    { return nil }

// awaitFirstAnswer probes the new workerd until it answers (first witness), exits, or its start
// deadline passes. A nil outcome means it runs.
func (p *Process) awaitFirstAnswer(exited chan error, proc workerdProcess) *outcome {
	deadline := time.NewTimer(p.m.opts.StartDeadline)
	defer deadline.Stop()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	answered := make(chan struct{}, 1)
	go func() {
		for ctx.Err() == nil {
			// The first answer has the start deadline: a process is not loaded yet.
			if p.liveness(ctx, p.m.opts.StartDeadline) == nil {
				answered <- struct{}{}
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	// A start at the least weight (its organization a suspect) on a node others saturate could run
	// past its deadline and fail for want of CPU: a third of the way there, it gets its
	// organization's weight back until it answers.
	var lift <-chan time.Time
	if p.startedStalled {
		t := time.NewTimer(p.m.opts.StartDeadline / 3)
		defer t.Stop()
		lift = t.C
	}
	for {
		select {
		case <-answered:
			p.probeAnswered(mono())
			return nil
		case err := <-exited:
			return &outcome{why: "workerd exited before it answered: " + exitText(err), limitHit: proc.LimitHit()}
		case <-p.stop:
			p.terminate(exited, proc)
			return &outcome{stopped: true}
		case <-lift:
			lift = nil
			if err := proc.SetStalled(false); err != nil {
				p.log.Warn("could not change a process's CPU share", "stalled", false, "error", err)
				continue
			}
			p.startedStalled = false
			p.log.Info("a start at the least CPU weight has not answered yet; it runs at its organization's weight", "after", (p.m.opts.StartDeadline / 3).String())
		case <-deadline.C:
			p.kill(exited, proc)
			return &outcome{why: fmt.Sprintf("workerd did not answer within %s of its start", p.m.opts.StartDeadline)}
		}
	}
}

// watch keeps a running workerd under watch until it exits, is stopped, or misses
// LivenessMisses probes in a row; then it is killed (SIGKILL: a looping workerd does not act on
// SIGTERM) and its requests in flight end with their connections.
func (p *Process) watch(exited chan error, started time.Time, proc workerdProcess) outcome {
	o := p.m.opts
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tick := time.NewTicker(o.LivenessPeriod)
	defer tick.Stop()
	type answer struct {
		err    error
		before int64
		at     int64 // when it came (mono)
	}
	answers := make(chan answer, 1)
	// misses counts the probes missed in a row that count toward a kill.
	probing, misses := false, 0
	lastAnswered := p.answered.Load()
	stable := func() bool { return time.Since(started) >= o.StableAfter }
	// While a worker holds the thread (from its first missed probe until the process answers),
	// and for o.SuspectFor after liveness killed a process of its organization, the organization
	// yields the CPU to every other organization's (SPEC 5.1: one tenant's loop does not slow
	// another's). The weight is only a share under contention: an idle node still runs it.
	stall := p.cpuSetting("stalled", p.startedStalled, proc.SetStalled)
	// held: a worker holds the thread now (a probe missed while nothing answered, or missed past
	// a load's allowance), until the process answers a probe. While every process of its
	// organization is held, the organization is also of the idle class (sandbox.Process.SetHeld):
	// it serves no one meanwhile. StallAfter unanswered does not hold it: a process merely slow at
	// the least weight on a busy node, or a worker computing for a while, goes that long without an
	// answer (seen in CI beside a quarantined loop), and the idle class would starve it.
	hold := p.cpuSetting("held", false, proc.SetHeld)
	suspect := func() bool { return p.m.suspect(p.key.org) }
	// yield is the CPU share of a process no worker holds: the least while its organization is a
	// suspect, its own otherwise.
	yield := func() {
		// An organization of the idle class cannot be given a weight (the kernel refuses it):
		// the weight follows only once the process is out of the class.
		if hold(false) {
			stall(suspect())
		}
	}
	stall(suspect())
	// A load holds the thread as a loop does, but the node asked for it (a 10 MiB bundle compiles
	// for seconds on a busy node). While one is in progress (a probe: a load on a request's
	// demand cannot be told from the request's own work), the organization keeps its weight (at
	// the least weight, a load on a contended node took its three misses itself, seen in CI) and
	// its misses count only after the allowance. A load that never ends is still killed for
	// them, and its candidate fails (SPEC 5.1).
	allowance := o.LoadAllowance
	if allowance == 0 {
		allowance = LoadAllowance
	}
	var loadMissedSince time.Time
	// loading: a load was in progress when the liveness probe in flight went out. A probe the
	// load held that is answered (missed) just after the load ended is the load's miss all the
	// same (seen in CI: the weight dropped at the load's end).
	loading := false
	// A probe still unanswered after StallAfter, with no answer of its workers meanwhile, already
	// says the thread is held: the weight drops then, not only once the probe has timed out.
	slow := time.NewTimer(time.Hour)
	slow.Stop()
	defer slow.Stop()
	for {
		select {
		case <-slow.C:
			// Busy is not stuck: a process whose workers answered since the probe went out
			// keeps its weight (the miss below makes the same exception).
			if probing && p.answered.Load() == lastAnswered && !loading && !p.anyProbing() {
				stall(true)
			}
		case err := <-exited:
			why := "workerd exited: " + exitText(err)
			hit := proc.LimitHit()
			if hit != "" {
				why += " (" + hit + ")"
			}
			return outcome{ran: true, stable: stable(), reason: adminapi.ReasonRestarting, why: why, limitHit: hit}
		case <-p.stop:
			p.terminate(exited, proc)
			return outcome{stopped: true}
		case <-tick.C:
			if probing {
				continue
			}
			probing = true
			loading = p.anyProbing()
			// What the workers answered since the last probe is this period's witness.
			before := lastAnswered
			lastAnswered = p.answered.Load()
			go func() {
				err := p.liveness(ctx, o.LivenessTimeout)
				answers <- answer{err: err, before: before, at: mono()}
			}()
			slow.Reset(min(StallAfter, o.LivenessTimeout))
		case a := <-answers:
			probing = false
			slow.Stop()
			switch {
			case a.err == nil:
				misses = 0
				yield()
				p.probeAnswered(a.at)
				loadMissedSince = time.Time{}
				continue
			case nodeFault(a.err):
				// No descriptor left, or the like: the node's own trouble is no tenant's fault.
				p.log.Warn("liveness probe failed on the node's side; not counted", "error", a.err)
				continue
			case p.answered.Load() != a.before:
				// The probe came late, but its workers answered requests meanwhile: busy, not
				// stuck (a worker in a loop holds the one thread, and nothing answers).
				misses = 0
				loadMissedSince = time.Time{}
				yield()
				continue
			}
			// One allowance per streak of misses: a load begun later in the streak (a tenant
			// may deploy at will) does not start another.
			if loading || p.anyProbing() {
				if loadMissedSince.IsZero() {
					loadMissedSince = time.Now()
				}
				if time.Since(loadMissedSince) < allowance {
					yield()
					p.log.Info("liveness probe missed while the process loads; not counted yet", "allowance", allowance.String())
					continue
				}
			}
			// Past the allowance, a load holds the thread as a loop does.
			misses++
			stall(true)
			hold(true)
			p.log.Warn("liveness probe missed", "misses", misses)
			if misses < LivenessMisses {
				continue
			}
			why := fmt.Sprintf("missed %d liveness probes in a row (every %s, each allowed %s): a worker holds the process's thread", misses, o.LivenessPeriod, o.LivenessTimeout)
			if !loadMissedSince.IsZero() {
				why = fmt.Sprintf("missed %d liveness probes in a row (every %s, each allowed %s) after the %s a load may hold its thread: a worker holds the process's thread", misses, o.LivenessPeriod, o.LivenessTimeout, allowance)
			}
			p.setState(procState{phase: phaseRestarting, reason: adminapi.ReasonUnresponsive, message: why + "; killing it", pid: proc.Pid()})
			subrequests := p.subrequests()
			p.kill(exited, proc)
			p.m.suspected(p.key.org)
			p.log.Warn("workerd killed: unresponsive", "misses", misses)
			return outcome{ran: true, stable: stable(), killed: true, reason: adminapi.ReasonUnresponsive, why: why, subrequests: subrequests}
		}
	}
}

// cpuSetting keeps one of a running workerd's CPU settings, starting at initial: the function it
// returns applies a new value through set, remembers it only once set, and reports whether the
// setting is now the value asked.
func (p *Process) cpuSetting(name string, initial bool, set func(bool) error) func(bool) bool {
	current := initial
	return func(v bool) bool {
		if v == current {
			return true
		}
		if err := set(v); err != nil {
			p.log.Warn("could not change a process's CPU share", name, v, "error", err)
			return false
		}
		current = v
		return true
	}
}

// subrequests answers, for each incarnation the process holds, its subrequests in flight and
// those that ended lately (mono).
func (p *Process) subrequests() map[*Incarnation][]subrequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	at := func(t time.Time) int64 {
		if t.IsZero() {
			return 0
		}
		return int64(t.Sub(monoBase))
	}
	out := map[*Incarnation][]subrequest{}
	for inc := range p.live {
		if inc.spec.Meter == nil {
			continue
		}
		for _, s := range inc.spec.Meter.Subrequests() {
			out[inc] = append(out[inc], subrequest{began: at(s.Began), sent: at(s.Sent), answered: at(s.Answered), ended: at(s.Ended)})
		}
	}
	return out
}

// probeAnswered records that the process answered a probe at (mono).
func (p *Process) probeAnswered(at int64) {
	p.alive.Store(at)
	p.sawAnswer(at)
}

// sawAnswer records that the process answered a probe or a request at (mono).
func (p *Process) sawAnswer(at int64) {
	for {
		last := p.lastAnswer.Load()
		if at <= last || p.lastAnswer.CompareAndSwap(last, at) {
			return
		}
	}
}

// nodeFault reports a probe that failed for a reason of the node's own: it ran out of
// descriptors or memory making the connection.
func nodeFault(err error) bool {
	for _, e := range []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOMEM, syscall.ENOBUFS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

// liveness asks the router to answer at once, over the ingress socket.
func (p *Process) liveness(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://router.takoform.invalid/", nil)
	if err != nil {
		return err
	}
	req.Header.Set(workerd.HeaderLiveness, "1")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b := make([]byte, 16)
	n, _ := resp.Body.Read(b)
	if resp.StatusCode != http.StatusOK || string(b[:n]) != "alive" {
		return fmt.Errorf("liveness probe answered %d", resp.StatusCode)
	}
	return nil
}

func (p *Process) kill(exited chan error, proc workerdProcess) {
	_ = syscall.Kill(proc.Pid(), syscall.SIGKILL)
	<-exited
}

func (p *Process) terminate(exited chan error, proc workerdProcess) {
	_ = syscall.Kill(proc.Pid(), syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(p.m.opts.StopGrace):
		p.kill(exited, proc)
	}
}

// cleanup ends the process for good: its sockets close, its directories go, and whatever is
// still placed in it is retired.
func (p *Process) cleanup() {
	p.mu.Lock()
	p.stopping = true
	p.st = procState{phase: phaseStopped, reason: adminapi.ReasonPending, message: "its process stopped"}
	p.current = nil
	if p.recycleTimer != nil {
		p.recycleTimer.Stop()
	}
	left := slices.Collect(maps.Values(p.live))
	p.mu.Unlock()
	p.m.forget(p)
	p.sock.close(p)
	for _, u := range left {
		u.retired.Store(true)
		p.mu.Lock()
		delete(p.live, u.inc)
		p.mu.Unlock()
		u.inc.dropUnit(u)
		u.inc.refresh()
		p.m.opts.Changed(u.inc)
	}
	close(p.done)
	p.log.Info("organization process stopped")
}

func exitText(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}
