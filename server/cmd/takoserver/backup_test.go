package main_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// Issue 34 item 4, the way back: `takoserver runtime backup` takes a consistent backup of a running
// node (0600, never overwriting, its secret sealed and its admin token absent), and `takoserver
// runtime restore` puts it back into the stopped node's state directory (refused while the node
// runs, and over a state without --replace), keeping the directory's admin token: the node started
// on it serves what it served when the backup was taken, secret included, and nothing since.
func TestARuntimeBackupRestoresTheNodeItWasTakenFrom(t *testing.T) {
	t.Parallel()
	const canary = "canary-runtime-backup-77d0"
	n := startRuntime(t)
	c, err := selfhost.New(n.adminURL, n.tokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	deploy := func(name, uid, body string, secrets ...string) {
		t.Helper()
		_, err := c.PutScript(ctx, name, adminapi.ScriptPut{
			EffectID: "put-" + name, WorkerUID: uid, DeploymentID: "dep-" + name, Generation: 1,
			Labels:  adminapi.Labels{Organization: "acme", Space: "prod", Worker: name},
			Modules: map[string]string{"main.js": body}, MainModule: "main.js", CompatibilityDate: "2024-09-23", SecretNames: secrets,
		})
		require.NoError(t, err)
		_, err = c.PutRoute(ctx, name+".workers.localhost", adminapi.RoutePut{EffectID: "route-" + name, ScriptName: name, EndpointUID: "ep-" + name, DeploymentID: "dep-" + name})
		require.NoError(t, err)
	}
	get := func(edge, name string) (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+edge+"/", nil)
		req.Host = name + ".workers.localhost"
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	deploy("kept", "uid-kept", `export default { fetch(req, env) { return new Response("kept " + env.TOKEN) } };`, "TOKEN")
	_, err = c.PutSecrets(ctx, "kept", adminapi.SecretsPut{EffectID: "secrets-kept", WorkerUID: "uid-kept", DeliveryID: "delivery-1",
		Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret(canary)}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { code, body := get(n.edgeAddr, "kept"); return code == 200 && body == "kept "+canary }, time.Minute, 50*time.Millisecond)

	out := filepath.Join(t.TempDir(), "node.backup")
	admin := []string{"--admin-url", n.adminURL, "--token-file", n.tokenFile}
	run(t, "", append([]string{"runtime", "backup", "--out", out}, admin...)...)
	info, err := os.Stat(out)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	_, errOut, err := runRaw("", append([]string{"runtime", "backup", "--out", out}, admin...)...)
	require.Error(t, err)
	require.Contains(t, errOut, "never overwrites")
	raw, err := os.ReadFile(out)
	require.NoError(t, err)
	token, err := os.ReadFile(n.tokenFile)
	require.NoError(t, err)
	_, content := unpackBackup(t, raw)
	require.NotContains(t, content, canary, "the delivery is sealed")
	require.NotContains(t, content, string(token), "the admin token is not in it")

	// After the backup: another worker, and the kept one deleted.
	deploy("later", "uid-later", `export default { fetch() { return new Response("later") } };`)
	_, err = c.DeleteRoute(ctx, "kept.workers.localhost", "kept", "ep-kept")
	require.NoError(t, err)
	_, err = c.DeleteScript(ctx, "kept", "uid-kept")
	require.NoError(t, err)

	_, errOut, err = runRaw("", "runtime", "restore", "--from", out, "--state-dir", n.stateDir, "--replace")
	require.Error(t, err)
	require.Contains(t, errOut, "in use by another runtime node")
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, n.cmd.Wait())
	_, errOut, err = runRaw("", "runtime", "restore", "--from", out, "--state-dir", n.stateDir)
	require.Error(t, err)
	require.Contains(t, errOut, "--replace")
	run(t, "", "runtime", "restore", "--from", out, "--state-dir", n.stateDir, "--replace")
	again, err := os.ReadFile(n.tokenFile)
	require.NoError(t, err)
	require.Equal(t, token, again, "the admin token stays")

	n = startRuntimeAt(t, n.stateDir, n.sealingKeyFile, "127.0.0.1:0", "127.0.0.1:0")
	code, body := get(n.edgeAddr, "kept")
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, "kept "+canary, body, "the restored node serves the kept worker with its secret")
	code, _ = get(n.edgeAddr, "later")
	require.Equal(t, http.StatusNotFound, code, "and nothing deployed after the backup")
}

// unpackBackup lists a backup's entries and joins their contents.
func unpackBackup(t *testing.T, b []byte) ([]string, string) {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	tr := tar.NewReader(gz)
	var names []string
	var all strings.Builder
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return names, all.String()
		}
		require.NoError(t, err)
		names = append(names, h.Name)
		c, err := io.ReadAll(tr)
		require.NoError(t, err)
		all.Write(c)
	}
}
