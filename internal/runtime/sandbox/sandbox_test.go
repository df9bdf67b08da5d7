package sandbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// requireSandbox builds a sandbox, or skips where this machine cannot have one (not root, no
// bwrap); under CI=true, where tests run as root with bubblewrap installed, it never skips.
func requireSandbox(t *testing.T, limits Limits) *Sandbox {
	t.Helper()
	s, err := New(Config{Limits: limits, Node: fmt.Sprintf("takoform-test-%d-%d", os.Getpid(), nextNode.Add(1))})
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true needs the sandbox: %v", err)
		}
		t.Skipf("this machine cannot sandbox: %v", err)
	}
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return s
}

// nextUID hands each test its own organizations' uids, so that parallel tests never share one.
var nextUID, nextNode atomic.Int64

func orgUID(t *testing.T) int {
	return DefaultUIDRange.First + 900 + int(nextUID.Add(1))
}

// syncBuffer collects a sandboxed program's output.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// probe runs the test binary in the sandbox as one of its probes.
func probe(t *testing.T, s *Sandbox, uid int, mode string, env []string, dir string, files []string, args ...string) (*Process, *syncBuffer) {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	out := &syncBuffer{}
	p, err := s.Start(Program{
		Path: self, Args: args, Dir: dir, Files: files, UID: uid,
		Env:  append([]string{probeEnv + "=" + mode, "GOTRACEBACK=none"}, env...),
		Name: fmt.Sprintf("inc-test-%s-%d", mode, time.Now().UnixNano()), Stdout: out, Stderr: out,
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.Wait() })
	return p, out
}

func TestASandboxedProcessRunsAsItsOrganizationsUIDAndSeesNothingOfTheNode(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{})
	// A real runtime state directory and its sealing key: its admin token beside the incarnation.
	base := t.TempDir()
	sealingKey := filepath.Join(base, "keys", "runtime-sealing-key")
	require.NoError(t, os.Mkdir(filepath.Dir(sealingKey), 0o700))
	require.NoError(t, state.WriteSealingKeyFile(sealingKey))
	st, err := state.Open(filepath.Join(base, "runtime"), state.SealingKey{File: sealingKey})
	require.NoError(t, err)
	t.Cleanup(st.Close)
	inc := filepath.Join(st.SocketsDir(), "p1.conf")
	require.NoError(t, safedir.Ensure(inc, st.Owner()))
	require.NoError(t, safedir.WriteFile(inc, "config.capnp", []byte("the config"), st.Owner()))
	require.FileExists(t, sealingKey)
	require.FileExists(t, st.TokenFile())

	uid := orgUID(t)
	p, out := probe(t, s, uid, "report", nil, inc, []string{"config.capnp"},
		WorkDir+"/config.capnp", st.Dir(), sealingKey, st.TokenFile(), inc, filepath.Join(inc, "config.capnp"), WorkDir+"/config.capnp")
	require.NoError(t, p.Wait(), out.String())
	var r probeReport
	require.NoError(t, json.Unmarshal([]byte(out.String()), &r), out.String())

	require.Equal(t, uid, r.UID, "the process runs as the organization's uid")
	require.Equal(t, uid, r.GID)
	require.NotZero(t, r.UID)
	require.Equal(t, "the config", r.Read, "the file handed in is there, read-only copy of the runtime's 0600 file")
	require.Empty(t, r.Paths[WorkDir+"/config.capnp"])
	for _, hidden := range []string{st.Dir(), sealingKey, st.TokenFile(), inc, filepath.Join(inc, "config.capnp")} {
		require.Contains(t, r.Paths[hidden], "no such file or directory", "%s must not exist inside the sandbox", hidden)
	}
	require.LessOrEqual(t, len(r.Pids), 2, "only the sandbox's own init and the probe are visible: %v", r.Pids)
}

func TestAnotherOrganizationCannotReadASandboxedProcessEnvironment(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{})
	a, b := orgUID(t), orgUID(t)
	pa, outA := probe(t, s, a, "hold", []string{"TAKOFORM_TEST_SECRET=hunter2-of-a"}, "", nil)
	_, outB := probe(t, s, b, "hold", nil, "", nil)
	require.Eventually(t, func() bool {
		return strings.Contains(outA.String(), "holding") && strings.Contains(outB.String(), "holding")
	}, 10*time.Second, 10*time.Millisecond)

	// Every process holding A's environment: bwrap outside, and inside the sandbox its init and
	// the program.
	pids := append([]int{pa.Pid()}, pa.SandboxPids()...)
	require.Len(t, pids, 3)
	for _, pid := range pids {
		environ := fmt.Sprintf("/proc/%d/environ", pid)
		status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		require.NoError(t, err)
		require.Regexp(t, fmt.Sprintf(`(?m)^Uid:\s+%d\s+%d\s+%d\s+%d$`, a, a, a, a), string(status), "process %d runs as A's uid", pid)

		// Control: the same reader as A's uid does read it, so the path is right.
		own, err := catAs(a, environ)
		require.NoError(t, err, own)
		require.Contains(t, own, "TAKOFORM_TEST_SECRET=")

		other, err := catAs(b, environ)
		require.Error(t, err, "B's uid read A's environment of process %d", pid)
		require.Contains(t, other, "Permission denied")
		require.NotContains(t, other, "hunter2")
	}
	// Nor is the value in any process's command line.
	for _, pid := range pids {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		require.NoError(t, err)
		require.NotContains(t, string(cmdline), "hunter2")
	}
}

// catAs reads a file with /bin/cat running as uid.
func catAs(uid int, path string) (string, error) {
	cmd := exec.Command("/bin/cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestTheTasksOfASandboxStopAtItsPidsCeiling(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{Pids: 32})
	p, out := probe(t, s, orgUID(t), "threads", nil, "", nil, "200")
	err := p.Wait()
	text := out.String()
	require.NotContains(t, text, "created 200 threads")
	require.Error(t, err, text)
	require.Regexp(t, `(pthread_create failed|failed to create new OS thread).*(Resource temporarily unavailable|errno=11)`, text)
	require.Contains(t, p.LimitHit(), "pids ceiling (32)")
}

func TestASandboxIsKilledAtItsMemoryCeiling(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{MemoryBytes: 64 << 20})
	p, out := probe(t, s, orgUID(t), "allocate", nil, "", nil, "512")
	err := p.Wait()
	require.Error(t, err, out.String())
	require.NotContains(t, out.String(), "allocated 512 MiB")
	require.Contains(t, p.LimitHit(), "killed at its memory ceiling (64 MiB)")
}

// One organization's incarnations together stop at the organization's ceiling, each within its
// own: many workers of one tenant cannot take the machine's memory from the others.
func TestAnOrganizationsIncarnationsStopAtItsCeilingTogether(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{MemoryBytes: 96 << 20, OrgMemoryBytes: 128 << 20})
	uid, other := orgUID(t), orgUID(t)
	held, heldOut := probe(t, s, uid, "allocate-hold", nil, "", nil, "80")
	require.Eventually(t, func() bool { return strings.Contains(heldOut.String(), "allocated 80 MiB") }, 20*time.Second, 20*time.Millisecond)

	// The organization's OOM kill ends one of the two, whichever the kernel picks: never both
	// holding 80 MiB.
	heldEnded := make(chan error, 1)
	go func() { heldEnded <- held.Wait() }()
	second, out := probe(t, s, uid, "allocate", nil, "", nil, "80")
	if second.Wait() == nil {
		require.Contains(t, out.String(), "allocated 80 MiB")
		select {
		case err := <-heldEnded:
			require.Error(t, err, "the first incarnation ended by itself")
		case <-time.After(10 * time.Second):
			t.Fatal("both incarnations of one organization held 80 MiB under its 128 MiB ceiling")
		}
	} else {
		require.NotContains(t, out.String(), "allocated 80 MiB")
	}

	elsewhere, out := probe(t, s, other, "allocate", nil, "", nil, "80")
	require.NoError(t, elsewhere.Wait(), "another organization is not held by the first one's ceiling: %s", out.String())
	require.Contains(t, out.String(), "allocated 80 MiB")
	_ = syscall.Kill(held.Pid(), syscall.SIGKILL)
}

func TestCgroupsHoldTheCeilingsAndGoWithTheProcess(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{MemoryBytes: 100 << 20, Pids: 77, CPUWeight: 50, CPUMax: 1.5})
	uid := orgUID(t)
	p, out := probe(t, s, uid, "hold", nil, "", nil)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "holding") }, 10*time.Second, 10*time.Millisecond)
	inside := p.SandboxPids()
	require.Len(t, inside, 2)
	dirs := append([]string{}, p.group.dirs...)
	require.Len(t, dirs, len(s.cg.hierarchies))
	for i, h := range s.cg.hierarchies {
		dir := dirs[i]
		require.Equal(t, fmt.Sprintf("%s/org-%d/%s", h.base, uid, filepath.Base(dir)), dir)
		require.Equal(t, h.dir, filepath.Dir(h.base), "the node's cgroup is under the runtime's own")
		require.ElementsMatch(t, inside, readPids(filepath.Join(dir, "cgroup.procs")), "the sandbox is in %s", dir)
		expect := map[string]string{}
		if h.serves(ctlMemory) {
			if h.v2 {
				expect["memory.max"] = "104857600"
			} else {
				expect["memory.limit_in_bytes"] = "104857600"
			}
		}
		if h.serves(ctlPids) {
			expect["pids.max"] = "77"
		}
		if h.serves(ctlCPU) {
			if h.v2 {
				expect["../cpu.weight"] = "50"
				expect["cpu.max"] = "150000 100000"
			} else {
				expect["../cpu.shares"] = "512"
				expect["cpu.cfs_quota_us"] = "150000"
			}
		}
		for file, want := range expect {
			b, err := os.ReadFile(filepath.Join(dir, file))
			require.NoError(t, err)
			require.Equal(t, want, strings.TrimSpace(string(b)), "%s/%s", dir, file)
		}
	}
	require.NoError(t, syscall.Kill(p.Pid(), syscall.SIGTERM))
	_ = p.Wait()
	for _, dir := range dirs {
		require.NoDirExists(t, dir)
		require.NoDirExists(t, filepath.Dir(dir), "the organization's cgroup goes with its last incarnation")
	}
	requireEnded(t, inside, "of the sandbox outlived it")
}

func TestANodeStartingAgainEndsWhatItsEarlierRunLeftInItsCgroups(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{})
	p, inside := holding(t, s)
	dirs := append([]string{}, p.group.dirs...)

	// The same node starts again (its earlier run was killed, and this sandbox outlived it).
	again, err := New(Config{Node: filepath.Base(s.cg.hierarchies[0].base)})
	require.NoError(t, err)
	requireEnded(t, inside, "of the earlier run still runs")
	for _, dir := range dirs {
		require.NoDirExists(t, dir)
	}
	require.NoError(t, again.Close())
	for _, h := range again.cg.hierarchies {
		require.NoDirExists(t, h.base)
	}
}

// A node killed for good (its state directory gone with it) is removed from the outside: what it
// left ends, and its cgroups go.
func TestRemoveNodeEndsAndRemovesWhatAKilledNodeLeft(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{})
	_, inside := holding(t, s)
	bases := []string{}
	for _, h := range s.cg.hierarchies {
		require.DirExists(t, h.base)
		bases = append(bases, h.base)
	}

	require.NoError(t, RemoveNode(filepath.Base(bases[0])))
	requireEnded(t, inside, "of the node still runs")
	for _, base := range bases {
		require.NoDirExists(t, base)
	}
	require.NoError(t, RemoveNode(filepath.Base(bases[0])), "a node with nothing left is nothing to remove")
	require.Error(t, RemoveNode("../x"))
}

// holding starts a probe that holds in a sandbox of s, and returns it with the pids inside its
// sandbox (its init and the probe).
func holding(t *testing.T, s *Sandbox) (*Process, []int) {
	t.Helper()
	p, out := probe(t, s, orgUID(t), "hold", nil, "", nil)
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "holding") }, 10*time.Second, 10*time.Millisecond)
	inside := p.SandboxPids()
	require.Len(t, inside, 2)
	return p, inside
}

// requireEnded waits until every process of pids has ended.
func requireEnded(t *testing.T, pids []int, what string) {
	t.Helper()
	for _, pid := range pids {
		require.Eventually(t, func() bool {
			_, err := os.Stat(fmt.Sprintf("/proc/%d", pid))
			return os.IsNotExist(err)
		}, 5*time.Second, 10*time.Millisecond, "process %d %s", pid, what)
	}
}

func TestNodeNameIsOnePerStateDirectory(t *testing.T) {
	require.Equal(t, NodeName("/var/lib/takoform/runtime"), NodeName("/var/lib/takoform/runtime"))
	require.NotEqual(t, NodeName("/var/lib/takoform/runtime"), NodeName("/var/lib/takoform/runtime2"))
	require.Regexp(t, `^takoform-[0-9a-f]{12}$`, NodeName("/x"))
}

func TestNewRefusesANodeWithoutBubblewrap(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Bwrap: filepath.Join(t.TempDir(), "bwrap")})
	require.ErrorContains(t, err, "bubblewrap")
}

func TestNewRefusesANodeThatCannotSwitchUIDs(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to run the check as another user")
	}
	// The test binary, run as nobody from its descriptor (its directory is root's alone).
	self, err := os.Open("/proc/self/exe")
	require.NoError(t, err)
	defer self.Close()
	cmd := exec.Command("/proc/self/fd/3")
	cmd.ExtraFiles = []*os.File{self}
	cmd.Env = []string{probeEnv + "=new"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "needs root or CAP_SETUID, CAP_SETGID and CAP_CHOWN")
}

func TestStartRefusesUIDsThatAreNotAnOrganizations(t *testing.T) {
	t.Parallel()
	s := requireSandbox(t, Limits{})
	for _, uid := range []int{0, os.Getuid(), DefaultUIDRange.First - 1, DefaultUIDRange.Last + 1} {
		_, err := s.Start(Program{Path: "/bin/true", UID: uid, Name: "inc-refused"})
		require.ErrorContains(t, err, "is not an organization's uid", "uid %d", uid)
	}
}
