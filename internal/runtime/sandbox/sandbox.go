// Package sandbox runs one program (workerd, one organization's process) as the organization's own
// unprivileged uid inside bubblewrap, with cgroup ceilings on its memory, tasks and CPU share
// (SPEC 5.1). workerd is not a sandbox for code nobody trusts; this is the outer layer.
//
// The runtime (root, or CAP_SETUID and CAP_SETGID with a delegated cgroup subtree) switches to the
// organization's uid and execs bwrap, which unshares the user, PID, IPC and cgroup namespaces,
// forbids further user namespaces, dies with its parent and starts a new session. Inside there is
// a private /proc, a minimal /dev, the program and its shared libraries read-only, the name
// resolution files and CA bundle of /etc read-only, and the program's files, copied in from file descriptors
// the runtime opened (--ro-bind-data), under WorkDir. Nothing else of the host's file system is
// there: not the runtime's state directory, its keys, its token, nor other organizations'
// processes. The program itself enters as a descriptor too (it is executed as /proc/self/fd/N), so
// its path on the host need not be reachable by the organization's uid. A program may be given one
// directory of the host, bound from a descriptor the runtime opened (Program.BindDir: the org
// process's socket directory), and no network of its own (Program.NoNetwork: a new network
// namespace with nothing in it), so that its only channels are the Unix sockets in that directory.
//
// Nothing secret travels in argv (/proc/<pid>/cmdline is world-readable) nor, for org processes,
// in the environment: code and secrets reach them over their own sockets.
//
// Under the runtime's own cgroup in each hierarchy (v1, v2 or a hybrid of both), each process gets
// org-<uid>/<name> with its ceilings. bwrap reports the sandbox's first pid (--json-status-fd) and
// waits (--block-fd) until the runtime has placed it in every hierarchy, so nothing of the program
// ever runs outside its cgroups.
package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// WorkDir is where the program's files are inside the sandbox, and its working directory.
const WorkDir = "/incarnation"

// Defaults of Limits (SPEC 5.1).
const (
	// DefaultMemoryBytes is one process's ceiling when its caller names none: Cloudflare's 128 MB
	// isolate limit with room for workerd itself (an idle workerd holds about 50 MiB of its own).
	// An org process's ceiling grows with the isolates it holds (see package orgproc).
	DefaultMemoryBytes = 256 << 20
	// DefaultPids bounds the tasks (processes and threads) of one process. An idle workerd has 2
	// threads and the sandbox 2 processes; an org process has no network, so workerd resolves no
	// hostname (each resolution took a thread of its own). 256 still stops a runaway long before
	// the machine's pid space.
	DefaultPids = 256
	// DefaultCPUWeight is the v2 default weight; every organization gets the same.
	DefaultCPUWeight = 100
	// StalledCPUWeight is an organization's weight while a worker holds one of its processes'
	// thread (Process.SetStalled): the least there is.
	StalledCPUWeight = 1
)

// Limits are the cgroup ceilings of every sandboxed process.
type Limits struct {
	// MemoryBytes is a process's memory ceiling when its Program names none (swap included:
	// none is allowed).
	MemoryBytes int64
	// Pids is each process's ceiling on tasks.
	Pids int64
	// CPUWeight is each organization's CPU weight (1-10000, the v2 scale; v1 cpu.shares gets
	// weight×1024/100). Equal for all, it shares the CPU equally between organizations under
	// contention, however many workers each runs.
	CPUWeight int
	// CPUMax, when above zero, caps each process at that many CPUs (cpu.max, cfs quota).
	CPUMax float64
	// OrgMemoryBytes and OrgPids cap all the processes of one organization together, so that one
	// organization cannot take the machine's memory or tasks from the others, and bound any one
	// process's ceiling (default: a quarter of the machine's memory, at least 1 GiB; sixteen
	// processes' tasks).
	OrgMemoryBytes int64
	OrgPids        int64
	// NodeMemoryBytes caps every sandbox of the node together, below the machine's memory, so
	// that running out ends a worker in its cgroup rather than the runtime or the machine
	// (default: the machine's memory less 1 GiB, or less a tenth where that is more).
	NodeMemoryBytes int64
}

func (l *Limits) defaults() {
	if l.MemoryBytes == 0 {
		l.MemoryBytes = DefaultMemoryBytes
	}
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	if l.CPUWeight == 0 {
		l.CPUWeight = DefaultCPUWeight
	}
	total := machineMemory()
	if l.OrgMemoryBytes == 0 {
		l.OrgMemoryBytes = max(total/4, 1<<30)
	}
	if l.OrgPids == 0 {
		l.OrgPids = 16 * l.Pids
	}
	if l.NodeMemoryBytes == 0 && total > 0 {
		l.NodeMemoryBytes = total - max(1<<30, total/10)
	}
}

// machineMemory is MemTotal of /proc/meminfo in bytes (0 when it cannot be read).
func machineMemory() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kib, err := strconv.ParseInt(f[1], 10, 64)
			if err == nil {
				return kib << 10
			}
		}
	}
	return 0
}

func (l Limits) validate() error {
	switch {
	case l.MemoryBytes < 16<<20:
		return fmt.Errorf("memory ceiling %d bytes is below 16 MiB: workerd cannot start in it", l.MemoryBytes)
	case l.Pids < 8:
		return fmt.Errorf("pids ceiling %d is below 8: the sandbox and workerd need more", l.Pids)
	case l.CPUWeight < 1 || l.CPUWeight > 10000:
		return fmt.Errorf("CPU weight %d is not within 1-10000", l.CPUWeight)
	case l.CPUMax < 0:
		return fmt.Errorf("CPU ceiling %g is negative", l.CPUMax)
	}
	return nil
}

// Config configures a Sandbox. Zero values take the defaults.
type Config struct {
	// Node names this node's cgroup under the runtime's own in each hierarchy (one per state
	// directory); New removes what an earlier run of the same node left there.
	Node string
	// Bwrap is the bubblewrap binary (default: bwrap on PATH).
	Bwrap string
	// UIDs is the range organizations' uids come from (default DefaultUIDRange).
	UIDs   UIDRange
	Limits Limits
}

// Sandbox starts sandboxed processes. It is safe for concurrent use.
type Sandbox struct {
	bwrap  string
	uids   UIDRange
	limits Limits
	cg     *cgroups

	mu   sync.Mutex
	libs map[string]libsEntry
}

type libsEntry struct {
	stamp string
	libs  []string
}

// New checks that this node can sandbox (the privilege to switch uids, bwrap, a cgroup it may
// create children in for each ceiling) and answers why not when it cannot.
func New(cfg Config) (*Sandbox, error) {
	if cfg.UIDs == (UIDRange{}) {
		cfg.UIDs = DefaultUIDRange
	}
	if err := cfg.UIDs.Validate(); err != nil {
		return nil, err
	}
	cfg.Limits.defaults()
	if err := cfg.Limits.validate(); err != nil {
		return nil, err
	}
	if err := checkPrivilege(); err != nil {
		return nil, err
	}
	name := cfg.Bwrap
	if name == "" {
		name = "bwrap"
	}
	bwrap, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("bubblewrap (%s) is not installed: %w (Debian: apt-get install bubblewrap)", name, err)
	}
	if bwrap, err = filepath.Abs(bwrap); err != nil {
		return nil, err
	}
	if !onePathElement(cfg.Node) {
		return nil, fmt.Errorf("sandbox node name %q is not one path element", cfg.Node)
	}
	cg, err := discoverCgroups(cfg.Limits, cfg.Node)
	if err != nil {
		return nil, err
	}
	return &Sandbox{bwrap: bwrap, uids: cfg.UIDs, limits: cfg.Limits, cg: cg, libs: map[string]libsEntry{}}, nil
}

// checkPrivilege: switching to another uid needs root or CAP_SETUID and CAP_SETGID, and handing an
// organization's process its socket directory needs CAP_CHOWN.
func checkPrivilege() error {
	if os.Geteuid() == 0 {
		return nil
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	if !hasSetIDCapabilities(status) {
		return fmt.Errorf("running organizations' workers as their own uids needs root or CAP_SETUID, CAP_SETGID and CAP_CHOWN; this node runs as uid %d without them", os.Geteuid())
	}
	return nil
}

// hasSetIDCapabilities reads CapEff of /proc/self/status for CAP_CHOWN (0), CAP_SETGID (6) and
// CAP_SETUID (7).
func hasSetIDCapabilities(status []byte) bool {
	for _, line := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "CapEff:"); ok {
			caps, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			const want = 1<<0 | 1<<6 | 1<<7
			return err == nil && caps&want == want
		}
	}
	return false
}

// Close removes the node's cgroups, ending whatever is still in them. Call it once every process
// has been waited for.
func (s *Sandbox) Close() error { return s.cg.close() }

// UIDs is the range organizations' uids come from.
func (s *Sandbox) UIDs() UIDRange { return s.uids }

// Limits are the ceilings every process gets.
func (s *Sandbox) Limits() Limits { return s.limits }

// Describe says how processes are sandboxed, for the node's start-up log.
func (s *Sandbox) Describe() string {
	var hs []string
	for _, h := range s.cg.hierarchies {
		hs = append(hs, h.String())
	}
	cpuMax := "none"
	if s.limits.CPUMax > 0 {
		cpuMax = strconv.FormatFloat(s.limits.CPUMax, 'g', -1, 64)
	}
	return fmt.Sprintf("bwrap %s, uids %s, memory %d MiB, pids %d, cpu weight %d per organization, cpu ceiling %s; cgroups: %s",
		s.bwrap, s.uids, s.limits.MemoryBytes>>20, s.limits.Pids, s.limits.CPUWeight, cpuMax, strings.Join(hs, "; "))
}

// Program is one process to run in the sandbox.
type Program struct {
	// Path is the binary on the host; Args its arguments.
	Path string
	Args []string
	// Dir holds Files, which the sandbox gets read-only at WorkDir/<name>.
	Dir   string
	Files []string
	// Env is the program's whole environment (secret values included); it is never in argv.
	Env []string
	// UID is the organization's uid (also its gid).
	UID int
	// Name names the process's cgroups: org-<UID>/<Name>. It must be unique on the node.
	Name string
	// MemoryBytes is this program's own memory ceiling; 0 takes Limits.MemoryBytes, and more
	// than the organization's ceiling takes that (SetMemory changes it while it runs).
	MemoryBytes int64
	// Stalled starts the program counted stalled (Process.SetStalled), so that its organization
	// runs at StalledCPUWeight before the program's first instruction: an organization that
	// liveness killed lately starts again yielding the CPU, not at its full weight until its new
	// process answers.
	Stalled bool
	// ExtraFiles become descriptors 3, 4, … in the sandbox (the listening socket).
	ExtraFiles []*os.File
	// BindDir, when set, is a directory of the host the sandbox sees read-write at BindAt (an
	// absolute path): bound from this descriptor, so that no path to it need be reachable by the
	// organization's uid.
	BindDir *os.File
	BindAt  string
	// NoNetwork gives the program a network namespace of its own with nothing in it: it reaches
	// nothing but the Unix sockets in BindDir.
	NoNetwork      bool
	Stdout, Stderr io.Writer
}

// Process is one running sandboxed program.
type Process struct {
	cmd      *exec.Cmd
	group    *group
	status   *os.File
	childPid int
	copying  *sync.WaitGroup
	output   []*os.File

	waitOnce sync.Once
	waitErr  error
	limitHit string
}

// Start runs p in the sandbox. It returns once the sandbox is in its cgroups and released; the
// program may still fail to start inside it (Wait then says so).
func (s *Sandbox) Start(p Program) (_ *Process, err error) {
	if p.UID <= 0 || p.UID == os.Getuid() || !s.uids.Contains(p.UID) {
		return nil, fmt.Errorf("uid %d is not an organization's uid of range %s", p.UID, s.uids)
	}
	if !onePathElement(p.Name) {
		return nil, fmt.Errorf("cgroup name %q is not one path element", p.Name)
	}
	libs, err := s.libraries(p.Path)
	if err != nil {
		return nil, err
	}
	// Every descriptor this process opens for the child is closed here once the child has its own.
	var opened []*os.File
	defer func() {
		for _, f := range opened {
			f.Close()
		}
	}()
	open := func(path string, flags int) (*os.File, error) {
		f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_CLOEXEC|flags, 0)
		if err == nil {
			opened = append(opened, f)
		}
		return f, err
	}
	// The program is the operator's (a link such as .tools/bin/workerd is followed); the files
	// are the runtime's own, and a link among them is refused.
	bin, err := open(p.Path, 0)
	if err != nil {
		return nil, fmt.Errorf("open the program: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	opened = append(opened, statusW)
	blockR, blockW, err := os.Pipe()
	if err != nil {
		statusR.Close()
		return nil, err
	}
	opened = append(opened, blockR)
	defer blockW.Close() // closed without a byte written, the sandbox still starts: only after placement
	extra := append([]*os.File{}, p.ExtraFiles...)
	fd := func(f *os.File) int {
		extra = append(extra, f)
		return 2 + len(extra)
	}
	binFD, statusFD, blockFD := fd(bin), fd(statusW), fd(blockR)
	bindFD := -1
	if p.BindDir != nil {
		if !filepath.IsAbs(p.BindAt) || filepath.Clean(p.BindAt) != p.BindAt || p.BindAt == "/" {
			statusR.Close()
			return nil, fmt.Errorf("bind path %q is not a clean absolute path", p.BindAt)
		}
		bindFD = fd(p.BindDir)
	}
	var dataFDs []int
	for _, name := range p.Files {
		if !onePathElement(name) {
			statusR.Close()
			return nil, fmt.Errorf("file name %q is not one path element", name)
		}
		f, err := open(filepath.Join(p.Dir, name), syscall.O_NOFOLLOW)
		if err != nil {
			statusR.Close()
			return nil, fmt.Errorf("open %s for the sandbox: %w", name, err)
		}
		dataFDs = append(dataFDs, fd(f))
	}

	g, err := s.cg.create(p.UID, p.Name, p.MemoryBytes, p.Stalled)
	if err != nil {
		statusR.Close()
		return nil, err
	}
	cmd := exec.Command(s.bwrap, bwrapArgs(libs, sandboxFDs{bin: binFD, status: statusFD, block: blockFD, bind: bindFD}, p, dataFDs)...)
	cmd.Env = p.Env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	// The organization's uid may not enter the runtime's directories; bwrap changes to WorkDir.
	cmd.Dir = "/"
	cmd.ExtraFiles = extra
	// The output goes through pipes of this process's own, not exec's copying goroutines: Wait
	// must return once bwrap has ended, even while something of the sandbox still holds them
	// (then removing the cgroup ends it).
	var copying sync.WaitGroup
	var readEnds []*os.File
	for _, o := range []struct {
		w   io.Writer
		dst *io.Writer
	}{{p.Stdout, &cmd.Stdout}, {p.Stderr, &cmd.Stderr}} {
		if o.w == nil {
			continue
		}
		r, w, err := os.Pipe()
		if err != nil {
			statusR.Close()
			closeAll(readEnds)
			_ = g.remove()
			return nil, err
		}
		opened = append(opened, w)
		readEnds = append(readEnds, r)
		*o.dst = w
		copying.Add(1)
		go func(dst io.Writer) {
			defer copying.Done()
			_, _ = io.Copy(dst, r)
		}(o.w)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(p.UID), Gid: uint32(p.UID)},
		// The sandbox dies with the runtime node, and runs in its own process group so a
		// terminal's Ctrl-C reaches only the node, which then stops it in order.
		Pdeathsig: syscall.SIGKILL, Setpgid: true,
	}
	if err := cmd.Start(); err != nil {
		statusR.Close()
		for _, f := range opened {
			f.Close()
		}
		opened = nil
		copying.Wait()
		closeAll(readEnds)
		_ = g.remove()
		return nil, fmt.Errorf("start bwrap: %w", err)
	}
	proc := &Process{cmd: cmd, group: g, status: statusR, copying: &copying, output: readEnds}
	for _, f := range opened {
		f.Close()
	}
	opened = nil
	fail := func(err error) (*Process, error) {
		_ = cmd.Process.Kill()
		_ = proc.Wait()
		return nil, err
	}
	if proc.childPid, err = readChildPid(statusR, 10*time.Second); err != nil {
		return fail(err)
	}
	if err := g.place(proc.childPid); err != nil {
		return fail(err)
	}
	// Release: the sandbox sets itself up and runs the program, in its cgroups from here on.
	if _, err := blockW.Write([]byte{1}); err != nil {
		return fail(fmt.Errorf("release the sandbox: %w", err))
	}
	return proc, nil
}

// publicFiles are files of the host every sandbox sees read-only where they exist, none of them
// private: the loader's cache, name resolution for outbound requests, and the CA bundle (workerd
// refuses to start without system CA certificates; these are the places it looks).
var publicFiles = []string{
	"/etc/ld.so.cache", "/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf",
	"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
	"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem",
}

// sandboxFDs are the descriptor numbers, in the sandbox's bwrap, of what the runtime hands it:
// the program, bwrap's status and block pipes, and the directory to bind (-1: none).
type sandboxFDs struct{ bin, status, block, bind int }

// bwrapArgs is the bubblewrap command line: namespaces, mounts, the program's files from
// descriptors, and the program run from its descriptor.
func bwrapArgs(libs []string, fds sandboxFDs, p Program, dataFDs []int) []string {
	a := []string{
		"--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-cgroup-try",
		"--disable-userns", "--die-with-parent", "--new-session",
	}
	if p.NoNetwork {
		a = append(a, "--unshare-net")
	}
	a = append(a, "--proc", "/proc", "--dev", "/dev")
	for _, lib := range libs {
		a = append(a, "--ro-bind", lib, lib)
	}
	for _, f := range publicFiles {
		a = append(a, "--ro-bind-try", f, f)
	}
	a = append(a, "--dir", WorkDir)
	for i, name := range p.Files {
		a = append(a, "--ro-bind-data", strconv.Itoa(dataFDs[i]), WorkDir+"/"+name)
	}
	if fds.bind >= 0 {
		// A mount of its own, which the remount of / below leaves as it is.
		a = append(a, "--bind-fd", strconv.Itoa(fds.bind), p.BindAt)
	}
	a = append(a, "--remount-ro", "/", "--chdir", WorkDir,
		"--json-status-fd", strconv.Itoa(fds.status), "--block-fd", strconv.Itoa(fds.block),
		fmt.Sprintf("/proc/self/fd/%d", fds.bin))
	return append(a, p.Args...)
}

// readChildPid reads the sandbox's first pid from bwrap's JSON status.
func readChildPid(r io.Reader, timeout time.Duration) (int, error) {
	type result struct {
		pid int
		err error
	}
	got := make(chan result, 1)
	go func() {
		var st struct {
			ChildPid int `json:"child-pid"`
		}
		err := json.NewDecoder(r).Decode(&st)
		if err == nil && st.ChildPid <= 0 {
			err = errors.New("no child-pid in its status")
		}
		got <- result{st.ChildPid, err}
	}()
	select {
	case res := <-got:
		if res.err != nil {
			return 0, fmt.Errorf("bwrap did not set up the sandbox (%v); its output says why", res.err)
		}
		return res.pid, nil
	case <-time.After(timeout):
		return 0, fmt.Errorf("bwrap reported no sandbox within %s", timeout)
	}
}

// Pid is bwrap's process on the host: a signal to it ends the whole sandbox.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// SandboxPids lists the processes inside the sandbox (its init and the program), as the host
// numbers them.
func (p *Process) SandboxPids() []int { return p.group.procs() }

// Wait waits for the sandbox to end, then removes its cgroups. It may be called more than once.
func (p *Process) Wait() error {
	p.waitOnce.Do(func() {
		p.waitErr = p.cmd.Wait()
		p.limitHit = p.group.limitHit()
		// bwrap's --die-with-parent leaves a window (a sandbox told to stop while it sets
		// itself up outlives its bwrap): removing the cgroup kills whatever is left.
		if err := p.group.remove(); err != nil {
			p.waitErr = errors.Join(p.waitErr, err)
		}
		p.copying.Wait()
		closeAll(p.output)
		p.status.Close()
	})
	return p.waitErr
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// LimitHit says, after Wait, which ceiling the program ran into ("" when none).
func (p *Process) LimitHit() string { return p.limitHit }

// SetStalled says whether a worker holds the program's thread (its liveness probe missed, or it
// answered again): while any process of an organization is stalled, the organization runs at
// StalledCPUWeight. The program's end clears it.
func (p *Process) SetStalled(stalled bool) error { return p.group.setStalled(stalled) }

// SetHeld says whether a worker holds the program's thread now (its liveness probe has gone
// unanswered while nothing else of it answered): while every process of an organization is
// held, the organization is also of the idle class where the kernel has cpu.idle. The program's
// end clears it.
func (p *Process) SetHeld(held bool) error { return p.group.setHeld(held) }

// SetMemory changes the program's memory ceiling while it runs (capped, as at Start, by the
// organization's).
func (p *Process) SetMemory(bytes int64) error { return p.group.setMemory(bytes) }

// libraries lists binary's shared libraries, once per version of the file.
func (s *Sandbox) libraries(binary string) ([]string, error) {
	info, err := os.Stat(binary)
	if err != nil {
		return nil, err
	}
	stamp := fmt.Sprintf("%d/%d", info.Size(), info.ModTime().UnixNano())
	s.mu.Lock()
	e, ok := s.libs[binary]
	s.mu.Unlock()
	if ok && e.stamp == stamp {
		return e.libs, nil
	}
	libs, err := sharedLibraries(binary)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.libs[binary] = libsEntry{stamp: stamp, libs: libs}
	s.mu.Unlock()
	return libs, nil
}

// onePathElement reports whether name is one element of a path, and not "." or "..".
func onePathElement(name string) bool {
	return name != "" && !strings.ContainsAny(name, "/\x00") && name != "." && name != ".."
}

// NodeName is the name of the cgroups of the node whose state directory is stateDir (an absolute
// path): one per state directory, whose lock makes them that node's alone.
func NodeName(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return "takoform-" + hex.EncodeToString(sum[:6])
}
