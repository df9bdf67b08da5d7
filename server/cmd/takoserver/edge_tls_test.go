package main_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// `takoserver runtime --edge-tls-cert --edge-tls-key` serves workers over HTTPS, and an operator
// who renews the certificate and sends SIGHUP gets the new one served by the same process.
func TestRuntimeCommandServesHTTPSAndReloadsOnSIGHUP(t *testing.T) {
	t.Parallel()
	ca := testpki.NewCA(t, "edge")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "edge.pem"), filepath.Join(dir, "edge-key.pem")
	install := func(p testpki.Pair) {
		for src, dst := range map[string]string{p.CertFile: certFile, p.KeyFile: keyFile} {
			b, err := os.ReadFile(src)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(dst+".new", b, 0o600))
			require.NoError(t, os.Rename(dst+".new", dst))
		}
	}
	install(ca.Server(t, "first", "*.workers.localhost"))
	stateDir := filepath.Join(t.TempDir(), "runtime")
	cmd := exec.Command(binary, "runtime", "--state-dir", stateDir, "--workerd", workerdtest.Binary(t),
		"--sealing-key-file", runtimetest.SealingKeyFile(t), "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0",
		"--edge-tls-cert", certFile, "--edge-tls-key", keyFile, "--edge-http-listen", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	forgetCgroups(t, stateDir)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	started := regexp.MustCompile(`^takoserver runtime: admin API (\S+) \(token in (\S+)\), edge (\S+)$`)
	https := regexp.MustCompile(`^takoserver runtime: the edge serves HTTPS \(HTTP/2 and HTTP/1.1\); plain HTTP on (\S+) redirects to it$`)
	lines := bufio.NewScanner(stderr)
	var adminURL, tokenFile, edgeAddr, httpAddr string
	for httpAddr == "" && lines.Scan() {
		if m := started.FindStringSubmatch(lines.Text()); m != nil {
			adminURL, tokenFile, edgeAddr = m[1], m[2], m[3]
		}
		if m := https.FindStringSubmatch(lines.Text()); m != nil {
			httpAddr = m[1]
		}
	}
	require.NotEmpty(t, httpAddr, "the runtime says its edge serves HTTPS")
	go func() { _, _ = io.Copy(io.Discard, stderr) }()

	c, err := selfhost.New(adminURL, tokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = c.PutScript(ctx, "tls-cli", adminapi.ScriptPut{
		EffectID: "e1", WorkerUID: "uid-tls-cli", DeploymentID: "d1", Generation: 1,
		Labels:            adminapi.Labels{Organization: "acme", Space: "prod", Worker: "tls"},
		Modules:           map[string]string{"main.js": `export default { fetch(req) { return new Response(req.url + "\n"); } };`},
		MainModule:        "main.js",
		CompatibilityDate: "2024-09-23",
	})
	require.NoError(t, err)
	_, err = c.PutRoute(ctx, "tls.workers.localhost", adminapi.RoutePut{EffectID: "e2", ScriptName: "tls-cli", EndpointUID: "ep", DeploymentID: "d1"})
	require.NoError(t, err)

	roots := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(pem))
	var served atomic.Pointer[x509.Certificate]
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: roots, VerifyConnection: func(cs tls.ConnectionState) error {
			served.Store(cs.PeerCertificates[0])
			return nil
		}},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, edgeAddr)
		},
		DisableKeepAlives: true,
	}}
	_, port, _ := net.SplitHostPort(edgeAddr)
	url := "https://tls.workers.localhost:" + port + "/x"
	require.Eventually(t, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == http.StatusOK && string(b) == url+"\n" && resp.ProtoMajor == 2
	}, 30*time.Second, 20*time.Millisecond, "the worker answers over HTTPS/2, and sees its https:// URL")
	require.Equal(t, "first", served.Load().Subject.CommonName)

	install(ca.Server(t, "renewed", "*.workers.localhost"))
	require.NoError(t, cmd.Process.Signal(syscall.SIGHUP))
	require.Eventually(t, func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return served.Load().Subject.CommonName == "renewed"
	}, 10*time.Second, 20*time.Millisecond, "SIGHUP reloads the certificate in the running process")
	require.NoError(t, cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, cmd.Wait(), "the node stops cleanly; SIGHUP did not end it")
}
