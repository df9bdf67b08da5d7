package cfstandin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// runner runs each script's current version in a workerd process of its own. A version is
// started before its upload is accepted (so a script that does not start is refused as Cloudflare
// refuses it), and that process then serves the script until the next version replaces it.
type runner struct {
	workerd     string
	serviceAddr string

	mu     sync.Mutex
	procs  map[scriptKey]*proc
	closed bool
}

type proc struct {
	version string
	addr    string
	cmd     *exec.Cmd
	dir     string
	done    chan struct{}
	output  *tailBuffer
}

func newRunner(workerd, serviceAddr string) *runner {
	return &runner{workerd: workerd, serviceAddr: serviceAddr, procs: map[scriptKey]*proc{}}
}

// errNoWorkerd means the stand-in was configured without workerd: scripts are kept but not run.
var errNoWorkerd = errors.New("the stand-in runs no workerd (Config.Workerd is empty)")

// startupError is a version that workerd refused to start; Message is workerd's own account.
type startupError struct{ Message string }

func (e *startupError) Error() string { return e.Message }

// probeSource answers the probe socket, which tells when workerd has loaded every service of the
// config (it opens its sockets only then) without running the script's own code.
const probeSource = `export default { fetch() { return new Response("ok"); } };`

// start launches version v and waits until it serves, or returns a *startupError with workerd's
// message when it exits first.
func (r *runner) start(v Version) (*proc, error) {
	if r.workerd == "" {
		return nil, errNoWorkerd
	}
	dir, err := os.MkdirTemp("", "cfstandin-workerd-")
	if err != nil {
		return nil, err
	}
	files, env, err := renderConfig(v, r.serviceAddr)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			_ = os.RemoveAll(dir)
			return nil, err
		}
	}
	var lc net.ListenConfig
	httpLn, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	probeLn, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		_ = httpLn.Close()
		_ = os.RemoveAll(dir)
		return nil, err
	}
	httpFile, err1 := httpLn.(*net.TCPListener).File()
	probeFile, err2 := probeLn.(*net.TCPListener).File()
	addr, probeAddr := httpLn.Addr().String(), probeLn.Addr().String()
	_ = httpLn.Close()
	_ = probeLn.Close()
	if err := errors.Join(err1, err2); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer httpFile.Close()
	defer probeFile.Close()

	out := &tailBuffer{limit: 16 << 10}
	cmd := exec.Command(r.workerd, "serve", "config.capnp", "config", "--socket-fd", "http=3", "--socket-fd", "probe=4")
	cmd.Dir = dir
	cmd.Env = env
	cmd.ExtraFiles = []*os.File{httpFile, probeFile}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start workerd: %w", err)
	}
	p := &proc{version: v.ID, addr: addr, cmd: cmd, dir: dir, done: make(chan struct{}), output: out}
	go func() { _ = cmd.Wait(); close(p.done) }()

	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-p.done:
			_ = os.RemoveAll(dir)
			return nil, &startupError{Message: startupMessage(out.String())}
		default:
		}
		if res, err := client.Get("http://" + probeAddr + "/"); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, &startupError{Message: "Script startup exceeded the time limit"}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startupMessage keeps workerd's error lines (the ones Cloudflare would answer with), without the
// config file's temporary path.
func startupMessage(out string) string {
	var lines []string
	for _, line := range strings.Split(out, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "workerd/") && !strings.Contains(line, "rror") {
			continue
		}
		lines = append(lines, line)
		if len(lines) == 4 {
			break
		}
	}
	if len(lines) == 0 {
		return "Script startup failed"
	}
	return strings.Join(lines, "\n")
}

// install makes p the process that serves key, stopping the one it replaces.
func (r *runner) install(key scriptKey, p *proc) {
	r.mu.Lock()
	old := r.procs[key]
	if r.closed {
		r.mu.Unlock()
		p.stop()
		return
	}
	r.procs[key] = p
	r.mu.Unlock()
	if old != nil {
		old.stop()
	}
}

// remove stops the process serving key.
func (r *runner) remove(key scriptKey) {
	r.mu.Lock()
	p := r.procs[key]
	delete(r.procs, key)
	r.mu.Unlock()
	if p != nil {
		p.stop()
	}
}

// running is the process that serves version versionID of key, if it runs.
func (r *runner) running(key scriptKey, versionID string) (*proc, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[key]
	if p == nil || p.version != versionID {
		return nil, false
	}
	select {
	case <-p.done:
		return nil, false
	default:
	}
	return p, true
}

// removeProc stops p if it still serves key (a later version's process is left alone).
func (r *runner) removeProc(key scriptKey, p *proc) {
	r.mu.Lock()
	if r.procs[key] != p {
		r.mu.Unlock()
		return
	}
	delete(r.procs, key)
	r.mu.Unlock()
	p.stop()
}

// cpuTime is the CPU time (user and system, every thread) the process has used, from
// /proc/<pid>/stat in clock ticks of 10 ms.
func (p *proc) cpuTime() (time.Duration, bool) {
	if p.cmd.Process == nil {
		return 0, false
	}
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0, false
	}
	// The command name, field 2, is in parentheses and may hold spaces: count after it.
	i := bytes.LastIndexByte(raw, ')')
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(raw[i+1:]))
	if len(fields) < 13 {
		return 0, false
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	return time.Duration(utime+stime) * tick, true
}

func (r *runner) closeAll() {
	r.mu.Lock()
	r.closed = true
	procs := r.procs
	r.procs = map[scriptKey]*proc{}
	r.mu.Unlock()
	for _, p := range procs {
		p.stop()
	}
}

func (p *proc) stop() {
	if p.cmd.Process != nil {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
	<-p.done
	_ = os.RemoveAll(p.dir)
}

// tailBuffer keeps the first limit bytes a process writes (workerd's start-up errors come first).
type tailBuffer struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.limit - b.buf.Len(); room > 0 {
		if len(p) > room {
			b.buf.Write(p[:room])
		} else {
			b.buf.Write(p)
		}
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
