package runtime_test

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/proctree"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// orgScript PUTs a script of one organization.
func (f *fixture) orgScript(name, org, uid, source string, secretNames ...string) {
	f.t.Helper()
	put := f.scriptPut(uid, 1, "v1", secretNames...)
	put.Labels.Organization = org
	put.Modules = map[string]string{"main.js": source}
	_, err := f.client.PutScript(f.ctx, name, put)
	require.NoError(f.t, err)
}

// sandboxProcesses lists the processes of a script's serving incarnation: bwrap, the sandbox's
// init and workerd (descendants of the pid the status reports).
func (f *fixture) sandboxProcesses(name string) []int {
	f.t.Helper()
	st, err := f.client.GetScript(f.ctx, name)
	require.NoError(f.t, err)
	require.NotNil(f.t, st.Incarnation)
	require.NotZero(f.t, st.Incarnation.PID)
	return descendants(f.t, st.Incarnation.PID)
}

// descendants is pid and every process below it.
func descendants(t *testing.T, pid int) []int {
	t.Helper()
	tree, err := proctree.Read()
	require.NoError(t, err)
	return tree.Descendants(pid)
}

var uidLine = regexp.MustCompile(`(?m)^Uid:\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`)

// processUID reads a process's real, effective, saved and filesystem uids, requiring them equal.
func processUID(t *testing.T, pid int) int {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(t, err)
	m := uidLine.FindStringSubmatch(string(status))
	require.NotNil(t, m)
	require.True(t, m[1] == m[2] && m[2] == m[3] && m[3] == m[4], "process %d: %s", pid, m[0])
	uid, _ := strconv.Atoi(m[1])
	return uid
}

// catAs reads a file with /bin/cat running as uid.
func catAs(uid int, path string) (string, error) {
	cmd := exec.Command("/bin/cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func TestEachOrganizationsWorkersRunAsItsOwnUIDWhichNoOtherOrganizationCanRead(t *testing.T) {
	t.Parallel()
	f := setup(t)
	st, err := f.client.Status(f.ctx)
	require.NoError(t, err)
	require.Equal(t, adminapi.SandboxBwrap, st.Sandbox)

	// An organization that came and went first: its uid is never handed to another.
	f.orgScript("early-prod-x", "early", "uid-x", workerSource("x"))
	f.waitReady("early-prod-x")
	early := processUID(t, f.sandboxProcesses("early-prod-x")[0])
	_, err = f.client.DeleteScript(f.ctx, "early-prod-x", "uid-x")
	require.NoError(t, err)

	const canaryA, canaryB = "canary-of-acme-4kQ2", "canary-of-evil-9Tz1"
	f.orgScript("acme-prod-api", "acme", "uid-a", workerSource("a"), "TOKEN")
	f.deliver("acme-prod-api", "uid-a", "delivery-a", canaryA)
	f.orgScript("evil-prod-api", "evil", "uid-b", workerSource("b"), "TOKEN")
	f.deliver("evil-prod-api", "uid-b", "delivery-b", canaryB)
	f.orgScript("acme-prod-web", "acme", "uid-c", workerSource("c"))
	for _, name := range []string{"acme-prod-api", "evil-prod-api", "acme-prod-web"} {
		f.waitReady(name)
	}
	f.route("api.acme.workers.localhost", "acme-prod-api", "ep-a")
	f.answers("api.acme.workers.localhost", expectReply("a", canaryA))

	uids := map[string]int{}
	for _, name := range []string{"acme-prod-api", "evil-prod-api", "acme-prod-web"} {
		procs := f.sandboxProcesses(name)
		require.Len(t, procs, 3, "%s: bwrap, the sandbox's init and workerd", name)
		uid := processUID(t, procs[0])
		for _, pid := range procs {
			require.Equal(t, uid, processUID(t, pid), "every process of %s runs as one uid", name)
		}
		require.True(t, sandbox.DefaultUIDRange.Contains(uid), "uid %d", uid)
		require.NotEqual(t, os.Getuid(), uid, "never the node's own uid")
		require.NotEqual(t, early, uid, "never another organization's uid")
		uids[name] = uid
	}
	require.Equal(t, uids["acme-prod-api"], uids["acme-prod-web"], "one uid per organization")
	require.NotEqual(t, uids["acme-prod-api"], uids["evil-prod-api"], "each organization its own uid")

	// evil's uid cannot read the environment of any process of acme's worker; acme's can (the
	// path is right), and it holds no secret: values reach the isolate over its process's socket.
	for _, pid := range f.sandboxProcesses("acme-prod-api") {
		environ := fmt.Sprintf("/proc/%d/environ", pid)
		own, err := catAs(uids["acme-prod-api"], environ)
		require.NoError(t, err, own)
		require.NotContains(t, own, canaryA)
		other, err := catAs(uids["evil-prod-api"], environ)
		require.Error(t, err)
		require.Contains(t, other, "Permission denied")
		require.NotContains(t, other, canaryA)
	}
	// Nor can it read the node's sealing key, token or sealed deliveries.
	for _, path := range []string{f.h.Config().SealingKeyFile, f.h.Info.TokenFile, filepath.Join(f.h.StateDir, "secrets", "uid-a")} {
		out, err := catAs(uids["evil-prod-api"], path)
		require.Error(t, err, "%s: %s", path, out)
		require.Contains(t, out, "Permission denied")
	}

	// An organization keeps its uid when the node restarts (were it allocated afresh, the
	// lowest free uid, early's, would go to one of them).
	f.h.Restart(t)
	f.reconnect()
	for name, uid := range uids {
		f.waitReady(name)
		require.Equal(t, uid, processUID(t, f.sandboxProcesses(name)[2]), "%s after a restart", name)
	}
}

func TestTheNodeRefusesToStartWithoutASandboxUnlessToldItIsInsecure(t *testing.T) {
	t.Parallel()
	key := runtimetest.SealingKeyFile(t)
	cfg := func() runtime.Config {
		admin, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		edge, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		t.Cleanup(func() { admin.Close(); edge.Close() })
		return runtime.Config{
			StateDir: filepath.Join(t.TempDir(), "runtime"), Workerd: workerdtest.Binary(t),
			AdminListener: admin, EdgeListener: edge, SealingKeyFile: key,
			Sandbox: sandbox.Config{Bwrap: filepath.Join(t.TempDir(), "no-bwrap-here")},
		}
	}
	_, err := runtime.Start(cfg())
	require.ErrorContains(t, err, "cannot sandbox its workers")
	require.ErrorContains(t, err, "--insecure-no-sandbox")

	insecure := cfg()
	insecure.InsecureNoSandbox = true
	logs := &runtimetest.Buffer{}
	insecure.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	n, err := runtime.Start(insecure)
	require.NoError(t, err)
	t.Cleanup(func() { _ = n.Close() })
	require.Contains(t, logs.String(), "THE OS SANDBOX IS OFF")
	c, err := selfhost.New(n.Info().AdminURL, n.Info().TokenFile)
	require.NoError(t, err)
	st, err := c.Status(t.Context())
	require.NoError(t, err)
	require.Equal(t, adminapi.SandboxOff, st.Sandbox, "the status says the sandbox is off")
}

// getOK sends one request through the edge and wants a 200.
func getOK(client *http.Client, url, host string) error {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d", host, resp.StatusCode)
	}
	return nil
}

func TestAnOrganizationKeepsItsUIDSoANodeWhoseRangeLostItRefusesToStart(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("acme-prod-api", "acme", "uid-a", workerSource("a"))
	f.waitReady("acme-prod-api")
	uid := processUID(t, f.sandboxProcesses("acme-prod-api")[0])
	require.NoError(t, f.h.Node.Close())

	admin, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	edge, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { admin.Close(); edge.Close() })
	_, err = runtime.Start(runtime.Config{
		StateDir: f.h.StateDir, Workerd: workerdtest.Binary(t), AdminListener: admin, EdgeListener: edge,
		SealingKeyFile: runtimetest.SealingKeyFile(t),
		Sandbox:        sandbox.Config{UIDs: sandbox.UIDRange{First: uid + 1, Last: uid + 1000}},
	})
	require.ErrorContains(t, err, fmt.Sprintf(`organization "acme" runs as uid %d, outside --sandbox-uid-range`, uid))
}

// hogSource allocates (and touches) 256 MiB at a time up to 3 GiB on /hog, and answers at once
// otherwise. Its first step alone passes the ceiling: in steps of 64 MiB, a hog on a loaded machine
// (CI's other packages beside it) was still under the ceiling when it missed its third liveness
// probe (111 MiB of 228), and was killed as unresponsive, not at its ceiling.
const hogSource = `const kept = [];
export default {
  async fetch(req) {
    if (new URL(req.url).pathname !== "/hog") return new Response("calm\n");
    let total = 0;
    while (total < 3072) {
      kept.push(new Uint8Array(256 << 20).fill(1));
      total += 256;
    }
    return new Response("allocated " + total + " MiB\n");
  }
};`

func TestAWorkerAllocatingThreeGiBIsKilledAtItsCeilingWhileAnotherKeepsServing(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("hog-prod-1", "hog", "uid-hog", hogSource)
	f.orgScript("calm-prod-1", "calm", "uid-calm", workerSource("calm"))
	f.waitReady("hog-prod-1")
	f.waitReady("calm-prod-1")
	f.route("hog.workers.localhost", "hog-prod-1", "ep-hog")
	f.route("calm.workers.localhost", "calm-prod-1", "ep-calm")
	f.answers("calm.workers.localhost", expectReply("calm", ""))
	f.answers("hog.workers.localhost", "calm\n")

	// The other tenant is served all the while.
	calm := f.poll("calm.workers.localhost")
	code, body, _ := f.h.Get(t, "hog.workers.localhost", "/hog")
	calmCalls := calm.finish()
	require.NotContains(t, body, "allocated 3072 MiB")
	require.GreaterOrEqual(t, code, 500, "the request that hit the ceiling fails: %d %s", code, body)
	require.NotEmpty(t, calmCalls)
	require.Empty(t, failures(calmCalls, time.Time{}))

	// Continuity restarts it, and counts the restart.
	st := f.waitStatus("the hog restarted", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation != nil && s.Incarnation.Restarts >= 1
	}, "hog-prod-1")
	require.GreaterOrEqual(t, st.Incarnation.Restarts, 1)
	require.Contains(t, f.h.Logs.String(), "killed at its memory ceiling (")
	f.answers("hog.workers.localhost", "calm\n")
	f.answers("calm.workers.localhost", expectReply("calm", ""))
}

// A worker's memory limit above the node's heap limit per isolate is refused, naming the limit,
// instead of running under a lower one than the worker was promised; at the limit it runs.
func TestAMemoryLimitAboveTheNodesCeilingIsRefused(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) { c.HeapLimitMB = 64 })
	put := f.scriptPut("uid-big", 1, "v1")
	put.Settings = workerconf.Settings{Limits: &workerconf.Limits{MemoryMB: 65}}
	_, err := f.client.PutScript(f.ctx, "acme-prod-big", put)
	require.True(t, selfhost.IsCode(err, adminapi.CodeMemoryAboveNode), "%v", err)
	require.ErrorContains(t, err, "limits.memoryMb 65 is above this runtime node's 64 MB per worker")
	st, err := f.client.GetScript(f.ctx, "acme-prod-big")
	require.NoError(t, err)
	require.False(t, st.Present, "nothing of the refused put is kept")

	put.EffectID, put.Settings.Limits.MemoryMB = f.effect(), 64
	_, err = f.client.PutScript(f.ctx, "acme-prod-big", put)
	require.NoError(t, err)
	f.waitReady("acme-prod-big")
}
