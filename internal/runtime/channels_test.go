package runtime_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// socketGetEnv makes the test binary a one-shot client instead of running tests: it GETs the
// path of its second argument over the Unix socket of its first, and prints the status (or the
// error), so that a test can try a socket as another uid.
const socketGetEnv = "TAKOFORM_TEST_SOCKET_GET"

func TestMain(m *testing.M) {
	if os.Getenv(socketGetEnv) != "" {
		fmt.Print(socketGet(os.Args[1], os.Args[2]))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func socketGet(socket, path string) string {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := client.Get("http://code.takoform.invalid" + path)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, body)
}

// getAs runs socketGet as uid (the test binary is executed through a descriptor: its directory
// is not the uid's to traverse).
func getAs(t *testing.T, uid int, socket, path string) string {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.Open(self)
	require.NoError(t, err)
	defer bin.Close()
	cmd := exec.Command("/proc/self/fd/3", socket, path)
	cmd.ExtraFiles = []*os.File{bin}
	cmd.Env = []string{socketGetEnv + "=1"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, string(out))
	return string(out)
}

// channelDirs maps each organization's uid to its process's socket directory.
func (f *fixture) channelDirs() map[int]string {
	f.t.Helper()
	entries, err := os.ReadDir(f.h.Info.ChannelsDir)
	require.NoError(f.t, err)
	out := map[int]string{}
	for _, e := range entries {
		path := filepath.Join(f.h.Info.ChannelsDir, e.Name())
		info, err := os.Stat(path)
		require.NoError(f.t, err)
		out[int(info.Sys().(*syscall.Stat_t).Uid)] = path
	}
	return out
}

// The sockets between the node and an organization's process are that organization's alone (SPEC
// 5, "No loopback door"): another organization's uid cannot reach them, anyone else the node
// refuses by its peer's credentials, and the code socket gives only the process's own incarnations
// (never another organization's, nor a retired one).
func TestNoOrganizationReachesAnotherOrganizationsProcessSockets(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-socket-door-8Qe1"
	f.orgScript("acme-api", "acme", "uid-a", workerSource("a"), "TOKEN")
	f.deliver("acme-api", "uid-a", "delivery-a", canary)
	f.orgScript("evil-api", "evil", "uid-e", workerSource("e"))
	acme, evil := f.waitReady("acme-api"), f.waitReady("evil-api")
	acmeUID := processUID(t, f.sandboxProcesses("acme-api")[0])
	evilUID := processUID(t, f.sandboxProcesses("evil-api")[0])
	dirs := f.channelDirs()
	require.Len(t, dirs, 2, "one socket directory per organization's process")
	code := filepath.Join(dirs[acmeUID], workerd.CodeSocket)
	acmeLoader, evilLoader := acme.Incarnation.ID+".1", evil.Incarnation.ID+".1"

	// The organization itself gets its own incarnation's code (so the refusals below are refusals).
	own := getAs(t, acmeUID, code, "/"+acmeLoader)
	require.True(t, strings.HasPrefix(own, "200 "), own)
	require.Contains(t, own, canary)
	// Another organization's uid does not get through the directory.
	for _, name := range []string{workerd.CodeSocket, workerd.EgressSocket, workerd.BindSocket, workerd.TailSocket} {
		out := getAs(t, evilUID, filepath.Join(dirs[acmeUID], name), "/"+acmeLoader)
		require.Contains(t, out, "permission denied", "%s as another organization", name)
		require.NotContains(t, out, canary)
	}
	// Anyone who does get to a socket (here: root) is refused by the node for their credentials.
	out := socketGet(code, "/"+acmeLoader)
	require.True(t, strings.HasPrefix(out, "error:"), out)
	require.NotContains(t, out, canary)
	// Through its own socket, an organization gets no other organization's code.
	foreign := getAs(t, acmeUID, code, "/"+evilLoader)
	require.True(t, strings.HasPrefix(foreign, "404 "), foreign)

	// Nor a retired incarnation's: once a newer one serves, the old id gets nothing.
	put := f.scriptPut("uid-a", 2, "a2", "TOKEN")
	put.Labels.Organization = "acme"
	_, err := f.client.PutScript(f.ctx, "acme-api", put)
	require.NoError(t, err)
	f.waitStatus("acme's generation 2 serving", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 2
	}, "acme-api")
	require.Eventually(t, func() bool { return f.h.Node.Stopping("acme-api") == 0 }, 15*time.Second, 10*time.Millisecond)
	retired := getAs(t, acmeUID, code, "/"+acmeLoader)
	require.True(t, strings.HasPrefix(retired, "404 "), retired)
}
