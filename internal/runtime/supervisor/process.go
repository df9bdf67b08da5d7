package supervisor

import (
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"syscall"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
)

// process is one start of an incarnation's workerd.
type process interface {
	// Pid is the process the supervisor signals: workerd itself, or the bwrap that holds its
	// sandbox (a signal to it ends the whole sandbox).
	Pid() int
	// Wait waits for it to end (and, sandboxed, removes its cgroups).
	Wait() error
	// LimitHit says, after Wait, which cgroup ceiling it ran into ("" when none).
	LimitHit() string
}

// startProcess starts workerd serving the config in its working directory, in the sandbox of its
// organization's uid when the supervisor has one. files become descriptors 3, 4, … either way,
// and socketArgs (--socket-fd NAME=FD, …) name them.
func (i *Incarnation) startProcess(files []*os.File, socketArgs []string, out *tailWriter) (process, error) {
	args := append([]string{"serve", ConfigFile, ConfigConst}, socketArgs...)
	env := i.spec.Env
	if env == nil {
		env = []string{}
	}
	if sb := i.opts.Sandbox; sb != nil {
		names := make([]string, 0, len(i.spec.Files))
		for name := range i.spec.Files {
			names = append(names, name)
		}
		sort.Strings(names)
		return sb.Start(sandbox.Program{
			Path: i.opts.Workerd, Args: args, Dir: i.spec.Dir, Files: names, Env: env,
			UID: i.spec.UID, Name: cgroupName(i.spec.Dir), MemoryBytes: i.spec.MemoryBytes, ExtraFiles: files, Stdout: out, Stderr: out,
		})
	}
	cmd := exec.Command(i.opts.Workerd, args...)
	cmd.Dir = i.spec.Dir
	cmd.Env = env
	cmd.ExtraFiles = files
	cmd.Stdout, cmd.Stderr = out, out
	// The process dies with the runtime node, and runs in its own process group so a terminal's
	// Ctrl-C reaches only the node, which then stops it in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return unsandboxed{cmd}, nil
}

// cgroupName names an incarnation's cgroup after its directory, which is unique on the node
// (script, identity and a random suffix): inc-<directory>.
func cgroupName(dir string) string {
	return "inc-" + filepath.Base(dir)
}

// unsandboxed is workerd run as the node's own user (--insecure-no-sandbox).
type unsandboxed struct{ cmd *exec.Cmd }

func (u unsandboxed) Pid() int         { return u.cmd.Process.Pid }
func (u unsandboxed) Wait() error      { return u.cmd.Wait() }
func (u unsandboxed) LimitHit() string { return "" }
