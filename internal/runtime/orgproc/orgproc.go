// Package orgproc runs the runtime node's workerd processes (SPEC 5, 5.1): one sandboxed process
// per organization (an *org process*), holding that organization's incarnations as dynamic
// isolates that the runtime's router loads through workerd's Worker Loader, and a process of its
// own for each quarantined incarnation.
//
// A Manager places each incarnation (Start) in its organization's process, starting the process
// when the organization has none, and stops a process once nothing is left in it. An incarnation
// is Ready on two witnesses (SPEC 5, seed 004): its process is running (it answered a liveness
// probe since its start), and the incarnation answered its probe in that process: the router loads
// it and calls an entrypoint no module exports, so its top level ran and no handler did. An
// incarnation that has served (admitted) reloads on its next request after its process restarts.
//
// Liveness: the Manager probes each process every second; three missed probes in a row (a worker
// in a loop holds the process's one thread) kill it, and continuity restarts it with capped
// exponential backoff. The incarnations implicated in a kill or an abort (a request of theirs in
// flight since before the first missed probe, or a load in progress) answer for it: a candidate
// fails, and a served incarnation implicated twice within an hour is quarantined into a process of
// its own. workerd never frees a retired isolate, so a process whose retired isolates outnumber
// its live ones, or that held secrets now replaced, is recycled: a fresh process loads and probes
// the live incarnations, the edge switches to it, and the old one drains and stops.
//
// Code and secrets reach a process only over its own Unix sockets, from the runtime's memory
// (Spec.Code), for the incarnations placed in it and no other; the sockets sit in a directory of
// the organization's uid bound into that sandbox alone, and the runtime checks each peer's
// credentials.
package orgproc

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
)

// Rules of SPEC 5 and 5.1.
const (
	// LivenessMisses is how many probes in a row a process may miss before it is killed.
	LivenessMisses = 3
	// StallAfter is how long a liveness probe may go unanswered before its process counts as
	// stalled for the CPU weight (it is killed only after LivenessMisses missed probes): a healthy
	// process answers in a millisecond or two.
	StallAfter = 100 * time.Millisecond
	// SuspectFor is how long, by default, an organization killed for an unresponsive process keeps
	// yielding the CPU after its process starts again (sandbox.Process.SetStalled): a worker that loops is
	// usually asked again at once, and would otherwise take its full share until its next miss.
	SuspectFor = time.Minute
	// LoadAllowance is how long, by default, a load may hold its process's thread before its
	// missed probes count: a 10 MiB bundle compiles in a few hundred milliseconds on an idle node,
	// for seconds on a busy one (as Kubernetes' startup probe holds off its liveness probe).
	LoadAllowance = 10 * time.Second
	// IncidentImplications within IncidentWindow raise an incident on an incarnation.
	IncidentImplications = 6
	IncidentWindow       = time.Hour
	// QuarantineImplications within QuarantineWindow quarantine an incarnation.
	QuarantineImplications = 2
	QuarantineWindow       = time.Hour
	// MaxQuarantine is how many quarantine processes one organization may have on a node.
	MaxQuarantine = 4
	// DefaultHeapLimitMB is V8's heap limit per isolate (Cloudflare's 128 MB per worker).
	DefaultHeapLimitMB = 128
)

// Options tune every process of a Manager. Zero values take the defaults.
type Options struct {
	// Workerd is the workerd binary.
	Workerd string
	// Sandbox runs each process as its organization's uid, with no network, in its own
	// namespaces and cgroups; nil runs it as the node's own user (--insecure-no-sandbox).
	Sandbox *sandbox.Sandbox
	// SocketsDir is the runtime's private directory (0700, the node's own) where each process
	// gets its ingress socket and config. ChannelsDir is where each gets the directory of its
	// channels to the runtime, bound into its sandbox: it must be traversable (0711) by the
	// organizations' uids on its whole path, as bubblewrap resolves a bound directory by its path
	// with the organization's uid. Everything in both is the Manager's.
	SocketsDir  string
	ChannelsDir string
	Logger      *slog.Logger

	// Backoff is the first restart delay; it doubles up to MaxBackoff, and starts over once a
	// process has stayed up for StableAfter.
	Backoff     time.Duration
	MaxBackoff  time.Duration
	StableAfter time.Duration
	// StartDeadline bounds how long a start may take to answer its first liveness probe.
	StartDeadline time.Duration
	// ProbeDeadline bounds how long one incarnation's probe may take.
	ProbeDeadline time.Duration
	// LivenessPeriod is how often a process is probed (default 1s), LivenessTimeout how long
	// one probe may take (default three quarters of the period, so that each probe has ended
	// before the next is due, and three misses take about three periods).
	LivenessPeriod  time.Duration
	LivenessTimeout time.Duration
	// SuspectFor is how long an organization yields the CPU after liveness killed its process
	// (0: SuspectFor; negative: not at all).
	SuspectFor time.Duration
	// LoadAllowance is how long a load the runtime asked for (a probe in progress) may hold the
	// process's thread before missed probes count toward its kill (0: LoadAllowance).
	LoadAllowance time.Duration
	// StopGrace is how long a stopping process gets between SIGTERM and SIGKILL.
	StopGrace time.Duration
	// DrainTimeout bounds how long a retired incarnation or process finishes its requests.
	DrainTimeout time.Duration
	// HeapLimitMB is V8's heap limit per isolate (default DefaultHeapLimitMB).
	HeapLimitMB int
	// MemoryBase and MemoryPerIsolate size a process's memory ceiling: the base, plus this much
	// for every isolate it holds (retired ones included), within its organization's ceiling.
	MemoryBase       int64
	MemoryPerIsolate int64
	// MemoryPerBundleByte is what an isolate holds, and its load takes at its peak, per byte of its
	// bundle, beside MemoryPerIsolate: a 10 MiB bundle is far from an idle isolate's 1.5 MiB
	// (default 10, measured: make bench-bundles).
	MemoryPerBundleByte int64
	// RecycleRetiredBytes recycles a process whose retired isolates are estimated at more than
	// this (at MemoryPerIsolate each); RecycleSecretsAfter recycles one this long after an
	// isolate holding secrets retired from it (SPEC 5: within an hour).
	RecycleRetiredBytes int64
	RecycleSecretsAfter time.Duration

	// BeforeCode, when set, is called before an isolate's code is given to its process, with its
	// loader id (tests hold a load with it).
	BeforeCode func(loaderID string)

	// Records are what an earlier run of the node kept of its incarnations' implications, by
	// incarnation id. Recorded, when set, is given every incarnation's record whenever one
	// changes, for the node to keep across its restarts.
	Records  map[string]Record
	Recorded func(map[string]Record)

	// BrakedOrg reports whether a lifecycle brake holds an organization's processes down;
	// BrakedIncarnation whether one holds an incarnation's reload.
	BrakedOrg         func(org string) bool
	BrakedIncarnation func(labels adminapi.Labels) bool
	// Egress and Binding serve what an incarnation sends out of its isolate: its fetch() (a
	// proxy-style request with an absolute URL) and its service binding calls. The requests
	// carry none of the runtime's headers. A binding call given a local is only to be admitted,
	// and handed to local, which runs it in the caller's process.
	Egress  func(w http.ResponseWriter, r *http.Request, from *Incarnation)
	Binding func(w http.ResponseWriter, r *http.Request, from *Incarnation, binding string, local edge.Local)
	// Changed is called (without locks held) whenever an incarnation's status may have moved.
	Changed func(*Incarnation)
	// Restarted is called once for every incarnation held by a process that restarts.
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
	if o.StartDeadline <= 0 {
		o.StartDeadline = 30 * time.Second
	}
	if o.ProbeDeadline <= 0 {
		o.ProbeDeadline = 30 * time.Second
	}
	if o.SuspectFor == 0 {
		o.SuspectFor = SuspectFor // a negative one turns the suspicion off
	}
	if o.LivenessPeriod <= 0 {
		o.LivenessPeriod = time.Second
	}
	if o.LivenessTimeout <= 0 || o.LivenessTimeout >= o.LivenessPeriod {
		o.LivenessTimeout = o.LivenessPeriod * 3 / 4
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 5 * time.Second
	}
	if o.DrainTimeout <= 0 {
		o.DrainTimeout = 30 * time.Second
	}
	if o.HeapLimitMB <= 0 {
		o.HeapLimitMB = DefaultHeapLimitMB
	}
	if o.MemoryBase <= 0 {
		// workerd's own ~50 MiB, and one isolate at its whole heap limit, with room.
		o.MemoryBase = int64(o.HeapLimitMB)<<20 + 96<<20
	}
	if o.MemoryPerIsolate <= 0 {
		// An idle isolate takes about 1.55 MiB (measured, SPEC 5); a small working set more.
		o.MemoryPerIsolate = 4 << 20
	}
	if o.MemoryPerBundleByte <= 0 {
		o.MemoryPerBundleByte = 10
	}
	if o.RecycleRetiredBytes <= 0 {
		o.RecycleRetiredBytes = 256 << 20
	}
	if o.RecycleSecretsAfter <= 0 {
		o.RecycleSecretsAfter = 10 * time.Minute
	}
	if o.BrakedOrg == nil {
		o.BrakedOrg = func(string) bool { return false }
	}
	if o.BrakedIncarnation == nil {
		o.BrakedIncarnation = func(adminapi.Labels) bool { return false }
	}
	if o.Changed == nil {
		o.Changed = func(*Incarnation) {}
	}
	if o.Restarted == nil {
		o.Restarted = func(*Incarnation) {}
	}
}

// procKey names a process slot: an organization's shared process (alone empty), or the process
// of one incarnation alone (quarantined).
type procKey struct {
	org   string
	alone string
}

// Manager runs a node's org processes. It is safe for concurrent use.
type Manager struct {
	opts Options
	log  *slog.Logger
	// socketsDir and channelsDir are SocketsDir and ChannelsDir, held open: processes' sockets
	// are bound and dialled through /proc/self/fd/N/…, whatever the length of the directories'
	// paths (a Unix socket path is at most 107 bytes).
	socketsDir  *os.File
	channelsDir *os.File

	mu    sync.Mutex
	procs map[procKey]*Process
	all   map[*Process]bool // every process not yet stopped, recycled-out ones included
	// blocked are quarantined incarnations waiting for a quarantine process of their own.
	blocked map[*Incarnation]bool
	gen     int
	closed  bool
	wg      sync.WaitGroup
	// earlier are the Records of incarnations not started since the manager began.
	earlier map[string]Record
	began   time.Time
	// recordMu keeps Recorded's calls in order.
	recordMu sync.Mutex

	// suspects are the organizations liveness killed a process of lately, and until when they
	// yield the CPU (Options.SuspectFor): every process of theirs, a restart or a quarantine
	// process included, starts and runs at the least CPU weight until then. Its own mutex: every
	// process's watch reads it once a probe.
	suspectMu sync.Mutex
	suspects  map[string]time.Time
}

// suspect reports whether liveness killed a process of organization org within SuspectFor.
func (m *Manager) suspect(org string) bool {
	m.suspectMu.Lock()
	defer m.suspectMu.Unlock()
	until, ok := m.suspects[org]
	if ok && !time.Now().Before(until) {
		delete(m.suspects, org)
		return false
	}
	return ok
}

// suspected records that liveness killed a process of organization org just now.
func (m *Manager) suspected(org string) {
	if m.opts.SuspectFor <= 0 {
		return
	}
	m.suspectMu.Lock()
	defer m.suspectMu.Unlock()
	if m.suspects == nil {
		m.suspects = map[string]time.Time{}
	}
	m.suspects[org] = time.Now().Add(m.opts.SuspectFor)
}

// New returns a Manager; Close stops every process it started. What a previous run left in
// SocketsDir is removed.
func New(opts Options) (*Manager, error) {
	opts.defaults()
	if opts.SocketsDir == "" || opts.ChannelsDir == "" {
		return nil, errors.New("orgproc: no sockets or channels directory")
	}
	var dirs []*os.File
	for _, dir := range []string{opts.SocketsDir, opts.ChannelsDir} {
		if err := clearSockets(dir); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(dir, os.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			for _, d := range dirs {
				d.Close()
			}
			return nil, fmt.Errorf("open the sockets directory: %w", err)
		}
		dirs = append(dirs, f)
	}
	return &Manager{opts: opts, log: opts.Logger, socketsDir: dirs[0], channelsDir: dirs[1],
		procs: map[procKey]*Process{}, all: map[*Process]bool{}, blocked: map[*Incarnation]bool{},
		earlier: maps.Clone(opts.Records), began: time.Now()}, nil
}

// Start places an incarnation in its organization's process (or a process of its own, when its
// spec says so) and returns it: a candidate is probed there once the process runs; an admitted one
// is Ready as soon as its process runs.
func (m *Manager) Start(spec Spec) (*Incarnation, error) {
	if spec.ID == "" || spec.Script == "" || spec.Code == nil || spec.Meter == nil {
		return nil, errors.New("orgproc: an incarnation needs an id, a script, its code and its meter")
	}
	inc := newIncarnation(m, spec)
	key := procKey{org: spec.Org}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errors.New("the runtime node is closing")
	}
	kept, remembered := m.rememberedLocked(spec.ID)
	if spec.Alone || kept.Quarantined && m.quarantinesLocked(spec.Org) < MaxQuarantine {
		key.alone = spec.ID
	}
	if _, err := m.placeLocked(key, inc, !spec.Admitted); err != nil {
		return nil, err // what was kept of it waits for the next start
	}
	if remembered {
		m.resumeLocked(inc, kept, key.alone != "")
	}
	return inc, nil
}

// placeLocked places inc as the current unit of key's process, started when there is none or
// when the one there is stopping (m.mu held).
func (m *Manager) placeLocked(key procKey, inc *Incarnation, probe bool) (*unit, error) {
	for {
		p := m.procs[key]
		if p == nil {
			m.gen++
			var err error
			if p, err = newProcess(m, key, m.gen, inc.spec.UID); err != nil {
				return nil, err
			}
			m.launchLocked(p)
		}
		if u, ok := p.place(inc, true, probe); ok {
			return u, nil
		}
		delete(m.procs, key) // stopping: its successor takes inc
	}
}

// launchLocked makes p its key's current process and runs it (m.mu held).
func (m *Manager) launchLocked(p *Process) {
	m.procs[p.key] = p
	m.all[p] = true
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		p.run()
		m.mu.Lock()
		delete(m.all, p)
		m.mu.Unlock()
	}()
}

// forget removes p as the current process of its key, when it is (it is stopping). A freed
// quarantine slot goes to an incarnation waiting for one.
func (m *Manager) forget(p *Process) {
	m.mu.Lock()
	mine := m.procs[p.key] == p
	if mine {
		delete(m.procs, p.key)
	}
	closed := m.closed
	m.mu.Unlock()
	if mine && p.key.alone != "" && !closed {
		go m.unblock(p.key.org)
	}
}

// quarantinesLocked counts org's processes of one incarnation alone (m.mu held).
func (m *Manager) quarantinesLocked(org string) int {
	n := 0
	for k := range m.procs {
		if k.org == org && k.alone != "" {
			n++
		}
	}
	return n
}

// WakeAll makes every held restart and every held reload look at the brakes again.
func (m *Manager) WakeAll() {
	m.mu.Lock()
	procs := slices.Collect(maps.Keys(m.all))
	m.mu.Unlock()
	for _, p := range procs {
		p.wakeUp()
	}
}

// Processes describes every running process, for the node's status and benchmarks.
func (m *Manager) Processes() []ProcessInfo {
	m.mu.Lock()
	procs := slices.Collect(maps.Keys(m.all))
	m.mu.Unlock()
	out := make([]ProcessInfo, 0, len(procs))
	for _, p := range procs {
		out = append(out, p.info())
	}
	slices.SortFunc(out, func(a, b ProcessInfo) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Close stops every process and waits for them; incarnations are stopped with them.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	procs := slices.Collect(maps.Keys(m.all))
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.shutdown() }()
	}
	wg.Wait()
	m.wg.Wait()
	_ = m.socketsDir.Close()
	_ = m.channelsDir.Close()
}
