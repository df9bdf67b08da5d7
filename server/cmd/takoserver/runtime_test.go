package main_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

// TestRuntimeCommandServesBrakesAndStopsCleanly runs `takoserver runtime` as an operator does,
// drives it with the Host's client, uses `takoserver runtime brake lifecycle`, and stops it with
// SIGTERM.
func TestRuntimeCommandServesBrakesAndStopsCleanly(t *testing.T) {
	t.Parallel()
	stateDir := filepath.Join(t.TempDir(), "runtime")
	cmd := exec.Command(binary, "runtime", "--state-dir", stateDir, "--workerd", workerdtest.Binary(t),
		"--sealing-key-file", runtimetest.SealingKeyFile(t), "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	forgetCgroups(t, stateDir)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	started := regexp.MustCompile(`^takoserver runtime: admin API (\S+) \(token in (\S+)\), edge (\S+)$`)
	lines := bufio.NewScanner(stderr)
	var adminURL, tokenFile, edgeAddr string
	for lines.Scan() {
		if m := started.FindStringSubmatch(lines.Text()); m != nil {
			adminURL, tokenFile, edgeAddr = m[1], m[2], m[3]
			break
		}
	}
	require.NotEmpty(t, adminURL, "the runtime says where it listens")
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	require.Equal(t, filepath.Join(stateDir, "admin-token"), tokenFile)

	c, err := selfhost.New(adminURL, tokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.PutScript(ctx, "cli-worker", adminapi.ScriptPut{
		EffectID: "e1", WorkerUID: "uid-cli", DeploymentID: "d1", Generation: 1,
		Labels:            adminapi.Labels{Organization: "acme", Space: "prod", Worker: "cli"},
		Modules:           map[string]string{"main.js": `export default { fetch() { return new Response("hello from cli\n"); } };`},
		MainModule:        "main.js",
		CompatibilityDate: "2024-09-23",
	})
	require.NoError(t, err)
	_, err = c.PutRoute(ctx, "cli.workers.localhost", adminapi.RoutePut{EffectID: "e2", ScriptName: "cli-worker", EndpointUID: "ep", DeploymentID: "d1"})
	require.NoError(t, err)
	// get answers 0 when the edge could not be reached, so that it may poll.
	get := func() (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/", nil)
		req.Host = "cli.workers.localhost"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	require.Eventually(t, func() bool { code, body := get(); return code == 200 && body == "hello from cli\n" }, 30*time.Second, 20*time.Millisecond)

	out := decodeJSON(t, run(t, "", "runtime", "brake", "lifecycle", "on", "--org", "acme", "--admin-url", adminURL, "--token-file", tokenFile, "--output", "json"))
	require.Equal(t, true, out["engaged"])
	require.Equal(t, []any{map[string]any{"organization": "acme"}}, out["lifecycle"])
	st, err := c.GetScript(ctx, "cli-worker")
	require.NoError(t, err)
	pid := st.Incarnation.PID
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool {
		st, err := c.GetScript(ctx, "cli-worker")
		return err == nil && st.Incarnation.Reason == adminapi.ReasonBraked
	}, 30*time.Second, 20*time.Millisecond, "a killed process stays down under the brake")
	code, _ := get()
	require.Equal(t, http.StatusServiceUnavailable, code)

	status := run(t, "", "runtime", "status", "--admin-url", adminURL, "--token-file", tokenFile)
	require.Contains(t, status, "lifecycle brakes: organization acme")
	require.Contains(t, status, "sandbox: bwrap", "the node runs its workers sandboxed")
	run(t, "", "runtime", "brake", "lifecycle", "off", "--org", "acme", "--admin-url", adminURL, "--token-file", tokenFile)
	require.Eventually(t, func() bool { code, _ := get(); return code == 200 }, 30*time.Second, 20*time.Millisecond, "released, it comes back")

	st, err = c.GetScript(ctx, "cli-worker")
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "SIGTERM is a clean stop")
	require.Error(t, syscall.Kill(st.Incarnation.PID, 0), "every workerd process stops with the node")
	entries, err := os.ReadDir(filepath.Join(stateDir, "sockets"))
	require.NoError(t, err)
	require.Empty(t, entries, "every process's sockets go with it")
	_, err = os.Stat(filepath.Join(stateDir, "desired.json"))
	require.NoError(t, err, "the desired state stays for the next start")

	_, errOut, err := runRaw("", "runtime", "brake", "lifecycle", "on", "--space", "x", "--admin-url", adminURL, "--token-file", tokenFile)
	require.Error(t, err)
	require.Contains(t, errOut, "scope")
}

// `takoserver runtime` starts only with its sealing key outside its state directory (SPEC 5.1);
// `takoserver runtime init-sealing-key` writes one (0600, never over another); a key an earlier
// version left in the state directory is refused with the move to make.
func TestRuntimeCommandNeedsItsSealingKeyOutsideItsStateDirectory(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	stateDir := filepath.Join(base, "runtime")
	start := func(extra ...string) string {
		args := append([]string{"runtime", "--state-dir", stateDir, "--workerd", workerdtest.Binary(t),
			"--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0"}, extra...)
		_, errOut, err := runRaw("", args...)
		require.Error(t, err, "takoserver runtime started: %s", errOut)
		return errOut
	}
	require.Contains(t, start(), "no sealing key: pass --sealing-key-file")

	key := filepath.Join(base, "keys", "runtime-sealing-key")
	require.NoError(t, os.Mkdir(filepath.Dir(key), 0o700))
	out := decodeJSON(t, run(t, "", "runtime", "init-sealing-key", "--out", key, "--output", "json"))
	require.Equal(t, key, out["sealingKeyFile"])
	info, err := os.Stat(key)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	_, errOut, err := runRaw("", "runtime", "init-sealing-key", "--out", key)
	require.Error(t, err)
	require.Contains(t, errOut, "never overwritten")

	inside := filepath.Join(stateDir, "my-key")
	require.NoError(t, os.Link(key, inside))
	require.Contains(t, start("--sealing-key-file", inside), "is inside the state directory")
	require.NoError(t, os.Rename(inside, filepath.Join(stateDir, "runtime-key")))
	require.Contains(t, start("--sealing-key-file", key), "mv "+filepath.Join(stateDir, "runtime-key")+" "+key)
}

func TestRuntimeCommandRefusesToRunWithoutItsSandbox(t *testing.T) {
	t.Parallel()
	key := filepath.Join(t.TempDir(), "runtime-sealing-key")
	run(t, "", "runtime", "init-sealing-key", "--out", key)
	_, errOut, err := runRaw("", "runtime", "--state-dir", filepath.Join(t.TempDir(), "runtime"), "--workerd", workerdtest.Binary(t),
		"--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0", "--bwrap", filepath.Join(t.TempDir(), "no-bwrap"),
		"--sandbox-memory-mib", "128", "--sandbox-uid-range", "300000-300999", "--sealing-key-file", key)
	require.Error(t, err)
	require.Contains(t, errOut, "cannot sandbox its workers")
	require.Contains(t, errOut, "--insecure-no-sandbox")

	_, errOut, err = runRaw("", "runtime", "--state-dir", filepath.Join(t.TempDir(), "runtime"), "--sandbox-uid-range", "0-10")
	require.Error(t, err)
	require.Contains(t, errOut, "holds root")
}
