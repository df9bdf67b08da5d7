package main_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
)

// Issue 34 item 4: a runtime node upgraded (stopped, and a new process started on its state
// directory) refuses no connection when its listening sockets outlive it, as systemd's socket
// activation keeps them (deploy/systemd/takoform-runtime.socket): the node adopts them as
// --edge-listen fd:3 --admin-listen fd:4, and connections made while no process runs wait in the
// socket's backlog until the next one serves them. Every request of a client sending throughout
// the restart, each on a new connection, is answered by the worker.
func TestARuntimeRestartOnInheritedSocketsRefusesNoConnection(t *testing.T) {
	t.Parallel()
	sockets := func() (*os.File, string) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		f, err := l.(*net.TCPListener).File()
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close()) // the duplicate in f keeps the socket listening
		t.Cleanup(func() { f.Close() })
		return f, addr
	}
	edgeFile, edgeAddr := sockets()
	adminFile, adminAddr := sockets()
	stateDir, key := filepath.Join(t.TempDir(), "runtime"), runtimetest.SealingKeyFile(t)
	n := startRuntimeAt(t, stateDir, key, "fd:4", "fd:3", edgeFile, adminFile)
	require.Equal(t, edgeAddr, n.edgeAddr, "the node serves the inherited edge socket")
	require.Equal(t, "http://"+adminAddr, n.adminURL, "and the inherited admin socket")

	c, err := selfhost.New(n.adminURL, n.tokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	_, err = c.PutScript(ctx, "handoff-worker", adminapi.ScriptPut{
		EffectID: "e1", WorkerUID: "uid-handoff", DeploymentID: "d1", Generation: 1,
		Labels:  adminapi.Labels{Organization: "acme", Space: "prod", Worker: "handoff"},
		Modules: map[string]string{"main.js": `export default { fetch() { return new Response("served") } };`}, MainModule: "main.js",
		CompatibilityDate: "2024-09-23",
	})
	require.NoError(t, err)
	_, err = c.PutRoute(ctx, "handoff.workers.localhost", adminapi.RoutePut{EffectID: "e2", ScriptName: "handoff-worker", EndpointUID: "ep", DeploymentID: "d1"})
	require.NoError(t, err)

	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	get := func() error {
		req, _ := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/", nil)
		req.Host = "handoff.workers.localhost"
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || string(b) != "served" {
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return nil
	}
	require.Eventually(t, func() bool { return get() == nil }, 30*time.Second, 20*time.Millisecond)

	var ok, failed atomic.Int64
	var last atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := get(); err != nil {
					failed.Add(1)
					last.Store(fmt.Sprintf("%s at %s", err, time.Now().Format("15:04:05.000")))
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	before := ok.Load()
	t.Logf("SIGTERM at %s", time.Now().Format("15:04:05.000"))
	require.NoError(t, n.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, n.cmd.Wait())
	t.Logf("stopped at %s", time.Now().Format("15:04:05.000"))
	n = startRuntimeAt(t, stateDir, key, "fd:4", "fd:3", edgeFile, adminFile)
	t.Logf("started at %s", time.Now().Format("15:04:05.000"))
	require.Eventually(t, func() bool { return ok.Load() > before+50 }, 60*time.Second, 20*time.Millisecond, "the new process serves")
	close(stop)
	wg.Wait()
	require.Zero(t, failed.Load(), "requests failed across the restart (last: %v)", last.Load())
}
