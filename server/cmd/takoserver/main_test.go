package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// binary is the takoserver built once for these tests: they run it as operators do.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "takoserver-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "takoserver")
	build := exec.Command("go", "build", "-o", binary, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build takoserver:", err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	testdb.Main(m)
}

// run runs takoserver with args and returns stdout, failing the test on a non-zero exit.
func run(t *testing.T, databaseURL string, args ...string) string {
	t.Helper()
	out, errOut, err := runRaw(databaseURL, args...)
	require.NoError(t, err, "takoserver %s: %s", strings.Join(args, " "), errOut)
	return out
}

func runRaw(databaseURL string, args ...string) (string, string, error) {
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), "TAKOSERVER_DATABASE_URL="+databaseURL)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// migratedWithKey is a fresh migrated database holding organization acme, and an API key of it.
func migratedWithKey(t *testing.T) (databaseURL, key string) {
	t.Helper()
	databaseURL = testdb.URL(t)
	run(t, databaseURL, "migrate", "up")
	run(t, databaseURL, "orgs", "create", "acme")
	return databaseURL, decodeJSON(t, run(t, databaseURL, "keys", "create", "--org", "acme", "--output", "json"))["key"].(string)
}

func decodeJSON(t *testing.T, s string) map[string]any {
	t.Helper()
	var out map[string]any
	require.NoError(t, json.Unmarshal([]byte(s), &out), "output: %s", s)
	return out
}

func keysOf(m map[string]any) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

func TestAdminCommandsScriptableOutput(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	org := decodeJSON(t, run(t, url, "orgs", "create", "acme", "--output", "json"))
	require.ElementsMatch(t, []string{"id", "name"}, keysOf(org))
	require.Equal(t, "acme", org["name"])
	require.Regexp(t, `^org_[a-z0-9]+$`, org["id"])

	key := decodeJSON(t, run(t, url, "keys", "create", "--org", "acme", "--scope", "resources:read", "--output", "json"))
	require.ElementsMatch(t, []string{"id", "key", "organizationId", "scopes"}, keysOf(key))
	require.Equal(t, org["id"], key["organizationId"])
	require.Equal(t, []any{"resources:read"}, key["scopes"])
	require.Regexp(t, `^tkf_`, key["key"])

	// The stored row holds a hash, never the key.
	db, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer db.Close(context.Background())
	var stored []byte
	require.NoError(t, db.QueryRow(context.Background(), "SELECT secret_hash FROM api_keys WHERE id = $1", key["id"]).Scan(&stored))
	require.NotContains(t, string(stored), key["key"])
	require.Len(t, stored, 32)

	revoked := decodeJSON(t, run(t, url, "keys", "revoke", key["id"].(string), "--output", "json"))
	require.Equal(t, true, revoked["revoked"])

	// keys list: every key with its expiry and last use, never its secret.
	brief := decodeJSON(t, run(t, url, "keys", "create", "--org", "acme", "--expires-in", "720h", "--output", "json"))
	require.NotEmpty(t, brief["expiresAt"])
	var listed []map[string]any
	require.NoError(t, json.Unmarshal([]byte(run(t, url, "keys", "list", "--org", "acme", "--output", "json")), &listed))
	require.Len(t, listed, 2)
	require.Equal(t, key["id"], listed[0]["id"])
	require.NotNil(t, listed[0]["revokedAt"])
	require.Equal(t, brief["expiresAt"], listed[1]["expiresAt"])
	require.Nil(t, listed[1]["lastUsedAt"], "never used")
	text := run(t, url, "keys", "list")
	require.Contains(t, text, "LAST USED")
	require.NotContains(t, text, brief["key"])

	_, errOut, err := runRaw(url, "orgs", "create", "acme")
	require.Error(t, err)
	require.Contains(t, errOut, "already exists")
	_, errOut, err = runRaw(url, "keys", "create", "--org", "nobody")
	require.Error(t, err)
	require.Contains(t, errOut, `no organization named "nobody"`)
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	require.EqualValues(t, 34, decodeJSON(t, run(t, url, "migrate", "version", "--output", "json"))["version"])
	require.EqualValues(t, 33, decodeJSON(t, run(t, url, "migrate", "down", "--output", "json"))["version"])
	require.EqualValues(t, 0, decodeJSON(t, run(t, url, "migrate", "down", "--steps", "33", "--output", "json"))["version"])
	require.EqualValues(t, 34, decodeJSON(t, run(t, url, "migrate", "up", "--output", "json"))["version"])
	require.Contains(t, run(t, url, "migrate", "version"), "version 34")
}

// host is one running `takoserver serve` process.
type host struct {
	url  string
	logs *runtimetest.Buffer
	cmd  *exec.Cmd
}

// node is one running `takoserver runtime` process.
type node struct {
	adminURL, tokenFile, edgeAddr string
	stateDir, sealingKeyFile      string
	// poolKeyFile and poolPublicKey: the node's pool key (SPEC 6.2), when it has one.
	poolKeyFile, poolPublicKey string
	cmd                        *exec.Cmd
}

// startRuntime runs `takoserver runtime` on port-0 listeners and a state directory of its own, as
// an operator runs it beside Host replicas.
func startRuntime(t *testing.T) node {
	t.Helper()
	return startRuntimeAt(t, filepath.Join(t.TempDir(), "runtime"), runtimetest.SealingKeyFile(t), "127.0.0.1:0", "127.0.0.1:0")
}

// startRuntimeAt runs `takoserver runtime` on stateDir with the sealing key file key, listening on
// admin and edge (host:port, or fd:N for the inherited descriptors, which are fd:3 onwards).
func startRuntimeAt(t *testing.T, stateDir, key, admin, edge string, inherited ...*os.File) node {
	t.Helper()
	return startPooledRuntimeAt(t, stateDir, key, "", nil, admin, edge, inherited...)
}

// startPooledRuntime runs `takoserver runtime` as startRuntime does, with a new pool key of the
// catalog's installation ("selfhost").
func startPooledRuntime(t *testing.T) node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "pool")
	require.NoError(t, os.Mkdir(dir, 0o700))
	poolKey := filepath.Join(dir, "pool-key")
	run(t, "", "nodes", "init-pool-key", "--pool", "selfhost", "--out", poolKey)
	return startPooledRuntimeAt(t, filepath.Join(t.TempDir(), "runtime"), runtimetest.SealingKeyFile(t), poolKey, nil, "127.0.0.1:0", "127.0.0.1:0")
}

// startPooledRuntimeAt is startRuntimeAt with the pool key file poolKey ("": none) and the
// runtime's flags extra.
func startPooledRuntimeAt(t *testing.T, stateDir, key, poolKey string, extra []string, admin, edge string, inherited ...*os.File) node {
	t.Helper()
	args := append([]string{"runtime", "--state-dir", stateDir, "--workerd", workerdtest.Binary(t),
		"--sealing-key-file", key, "--admin-listen", admin, "--edge-listen", edge}, extra...)
	var public string
	if poolKey != "" {
		args = append(args, "--pool-key-file", poolKey)
		k, err := poolkey.ReadFile(poolKey)
		require.NoError(t, err)
		public = k.Public().String()
	}
	cmd := exec.Command(binary, args...)
	cmd.ExtraFiles = inherited
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	forgetCgroups(t, stateDir)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	started := regexp.MustCompile(`^takoserver runtime: admin API (\S+) \(token in (\S+)\), edge (\S+)$`)
	lines := bufio.NewScanner(stderr)
	n := node{cmd: cmd, stateDir: stateDir, sealingKeyFile: key, poolKeyFile: poolKey, poolPublicKey: public}
	for lines.Scan() {
		if m := started.FindStringSubmatch(lines.Text()); m != nil {
			n.adminURL, n.tokenFile, n.edgeAddr = m[1], m[2], m[3]
			break
		}
	}
	require.NotEmpty(t, n.adminURL, "the runtime says where it listens")
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return n
}

// forgetCgroups removes, once the test is over, the cgroups a runtime node on stateDir may have
// left: a node killed with SIGKILL cannot remove its own, and none starts again on a test's
// directory to sweep them. Called before the node's cleanup is registered, it runs after it.
func forgetCgroups(t *testing.T, stateDir string) {
	t.Helper()
	abs, err := filepath.Abs(stateDir)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := sandbox.RemoveNode(sandbox.NodeName(abs)); err != nil {
			t.Errorf("the cgroups of the node on %s: %v", abs, err)
		}
	})
}

// catalog writes a catalog file whose selfhost installation drives n, with installationFields
// ("name": value) added to it, and returns its path.
func (n node) catalog(t *testing.T, installationFields ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "catalog.json")
	pool := ""
	if n.poolPublicKey != "" {
		pool = fmt.Sprintf(`, "poolPublicKey": %q`, n.poolPublicKey)
	}
	for _, f := range installationFields {
		pool += ", " + f
	}
	require.NoError(t, os.WriteFile(path, []byte(fmt.Sprintf(`{
  "installations": [{"name": "selfhost", "pack": "selfhost", "runtimeUrl": %q, "runtimeTokenFile": %q, "edgeListen": %q%s}],
  "offerings": [
    {"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": ["*"]},
    {"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": ["*"]}
  ]
}`, n.adminURL, n.tokenFile, n.edgeAddr, pool)), 0o600))
	return path
}

// sealingKey writes a sealing key-encryption key for one database's Hosts (every replica gets the
// same file) and returns its path.
func sealingKey(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sealing-key")
	run(t, "", "keys", "init-sealing", "--out", path)
	return path
}

// startHost starts a Host on databaseURL with the sealing key file kek, in a working directory of
// its own.
func startHost(t *testing.T, databaseURL, kek string, extra ...string) host {
	t.Helper()
	cmd, logs := startServe(t, databaseURL, append([]string{"--listen", "127.0.0.1:0", "--sealing-key-file", kek}, extra...)...)
	h := host{url: "http://" + listeningAt(t, logs), logs: logs, cmd: cmd}
	waitReady(t, h.url+"/readyz")
	return h
}

// startServe starts `takoserver serve args…` on databaseURL in a working directory of its own
// (every replica its own), stopped with SIGTERM when the test ends.
func startServe(t *testing.T, databaseURL string, args ...string) (*exec.Cmd, *runtimetest.Buffer) {
	t.Helper()
	cmd := exec.Command(binary, append([]string{"serve"}, args...)...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "TAKOSERVER_DATABASE_URL="+databaseURL)
	logs := &runtimetest.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	return cmd, logs
}

// listening is where a Host says it listens: serve's log line, or dev's banner.
var listening = regexp.MustCompile(`"msg":"takoserver listening"[^\n]*"address":"([^"]+)"|takoserver dev is serving at http://(\S+) `)

// listeningAt waits until a Host started with --listen 127.0.0.1:0 says, in what it has written
// to logs, where it listens, and returns that address. The tests let the Host pick its port:
// with a port picked in advance and freed, another test's listener (a workerd socket answers every
// path) can take it before the Host binds it, and the test then talks to that listener, readiness
// probe included.
func listeningAt(t *testing.T, logs *runtimetest.Buffer) string {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			return m[1] + m[2]
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the Host never said where it listens:\n%s", logs.String())
	return ""
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s never became ready", url)
}

type answer struct {
	status   int
	replayed string
	body     string
}

func put(url, key, token, body string) (answer, error) {
	return putWith(http.DefaultClient, url, key, token, body)
}

// TestOneTokenFiftyRequestsTwoHostsOneEffect: 50 identical requests with one token, sent at once
// to two Host processes on one database, produce exactly one effect and 50 identical bodies.
func TestOneTokenFiftyRequestsTwoHostsOneEffect(t *testing.T) {
	t.Parallel()
	url, key := migratedWithKey(t)
	kek := sealingKey(t)
	hosts := []host{startHost(t, url, kek), startHost(t, url, kek)}

	const n = 50
	answers := make([]answer, n)
	errs := make([]error, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i], errs[i] = put(hosts[i%2].url+"/v1/worker-endpoint-origin-reservations/res-race", key,
				"token-race-000000000001", `{"space":"prod","workerName":"api"}`)
		}()
	}
	close(start)
	wg.Wait()

	fresh := 0
	for i := range n {
		require.NoError(t, errs[i])
		require.Equal(t, http.StatusCreated, answers[i].status, "request %d: %s", i, answers[i].body)
		require.Equal(t, answers[0].body, answers[i].body, "request %d body differs", i)
		if answers[i].replayed == "" {
			fresh++
		}
	}
	require.Equal(t, 1, fresh, "exactly one request performs the effect; the others are replays")

	db, err := pgx.Connect(context.Background(), url)
	require.NoError(t, err)
	defer db.Close(context.Background())
	var rows, bindings int
	var revision int64
	require.NoError(t, db.QueryRow(context.Background(), "SELECT count(*), max(revision) FROM worker_endpoint_origin_reservations").Scan(&rows, &revision))
	require.NoError(t, db.QueryRow(context.Background(), "SELECT count(*) FROM ownership_bindings").Scan(&bindings))
	require.Equal(t, 1, rows)
	require.EqualValues(t, 1, revision)
	require.Equal(t, 1, bindings)
}

func TestServeRefusesBadCatalog(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	path := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"installations":[{"name":"x","pack":"selfhost","colour":"red"}]}`), 0o600))
	_, errOut, err := runRaw(url, "serve", "--listen", "127.0.0.1:0", "--config", path, "--sealing-key-file", sealingKey(t))
	require.Error(t, err)
	require.Contains(t, errOut, `unknown field "colour"`)
}

// A takoserver older than its database (another release migrated it further) refuses to start,
// naming both schema versions, and changes nothing.
func TestServeRefusesADatabaseNewerThanItself(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	db, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(context.Background(), `UPDATE schema_migrations SET version = version + 1`)
	require.NoError(t, err)
	_, errOut, err := runRaw(url, "serve", "--listen", "127.0.0.1:0", "--sealing-key-file", sealingKey(t))
	require.Error(t, err)
	newer, mine := store.SchemaVersion()+1, store.SchemaVersion()
	require.Contains(t, errOut, fmt.Sprintf("the database is at schema version %d, newer than this takoserver's %d", newer, mine))
	var version int64
	require.NoError(t, db.QueryRow(context.Background(), `SELECT version FROM schema_migrations`).Scan(&version))
	require.EqualValues(t, newer, version, "nothing migrated")
}

// A restarted Host whose previous process still holds its address waits for it (--listen-wait)
// instead of exiting on EADDRINUSE, says so once, and serves as soon as the address is let go.
func TestServeWaitsForItsBusyListenAddress(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := held.Addr().String()
	_, logs := startServe(t, testdb.URL(t), "--listen", addr, "--listen-wait", "60s", "--sealing-key-file", sealingKey(t))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "listen address in use; trying again") },
		60*time.Second, 20*time.Millisecond, "it says it waits:\n%s", logs.String())
	require.NoError(t, held.Close())
	require.Equal(t, addr, listeningAt(t, logs))
	waitReady(t, "http://"+addr+"/readyz")
	require.Equal(t, 1, strings.Count(logs.String(), "listen address in use"), "said once")
}

// A flag whose default the machine decides says so in its help, with no "(default …)" figure
// beside it that is not the default.
func TestRuntimeHelpShowsNoFalseDefault(t *testing.T) {
	t.Parallel()
	help := run(t, "", "runtime", "--help")
	line := regexp.MustCompile(`--sandbox-org-memory-mib[^\n]*`).FindString(help)
	require.Contains(t, line, "a quarter of the machine's memory")
	require.NotContains(t, line, "(default 256)")
	require.Regexp(t, `--sandbox-memory-mib[^\n]*\(default 256\)`, help, "a real default is still shown")
}

// devDir returns a path for a dev directory whose parent the cluster's user can traverse (the
// cluster runs as an unprivileged user when the tests run as root).
func devDir(t *testing.T) string {
	t.Helper()
	base, err := os.MkdirTemp("", "tkdev-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(base, 0o755))
	t.Cleanup(func() { os.RemoveAll(base) })
	return filepath.Join(base, "dev")
}

type devProcess struct {
	cmd            *exec.Cmd
	stdout, stderr *runtimetest.Buffer
	url            string
}

func startDev(t *testing.T, dir string, extra ...string) devProcess {
	t.Helper()
	args := []string{"dev", "--dir", dir, "--listen", "127.0.0.1:0", "--workerd", workerdtest.Binary(t),
		"--runtime-state-dir", filepath.Join(filepath.Dir(dir), "runtime"), "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0"}
	cmd := exec.Command(binary, append(args, extra...)...)
	cmd.Env = os.Environ()
	stdout, stderr := &runtimetest.Buffer{}, &runtimetest.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		_ = cmd.Wait()
	})
	url := "http://" + listeningAt(t, stdout)
	waitReady(t, url+"/readyz")
	return devProcess{cmd: cmd, stdout: stdout, stderr: stderr, url: url}
}

func (d devProcess) stop(t *testing.T) {
	t.Helper()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGINT))
	require.NoError(t, d.cmd.Wait(), "dev exits cleanly on interrupt")
}

func capabilities(t *testing.T, url, key string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url+"/v1/capabilities", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestDevRunsEverythingInOneCommandAndReusesTheCluster(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	first := startDev(t, dir)

	keyFile := filepath.Join(dir, "api-key")
	info, err := os.Stat(keyFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	dirInfo, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), dirInfo.Mode().Perm())
	raw, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	key := strings.TrimSpace(string(raw))
	require.Equal(t, http.StatusOK, capabilities(t, first.url, key))
	require.Contains(t, first.stdout.String(), "export TAKOFORM_API_KEY")
	require.NotContains(t, first.stdout.String(), key, "the key is written to a file, not printed")
	require.Contains(t, first.stdout.String(), "(http://<hostname>:<port>/)", "dev's edge stays on plain HTTP unless asked")
	devServesAWorker(t, first, key)
	info, err = os.Stat(filepath.Join(dir, "runtime-sealing-key"))
	require.NoError(t, err, "dev writes the runtime's sealing key beside its other keys")
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	_, err = os.Stat(filepath.Join(filepath.Dir(dir), "runtime", "runtime-key"))
	require.ErrorIs(t, err, os.ErrNotExist, "and not in the runtime's state directory")

	first.stop(t)
	_, err = os.Stat(filepath.Join(dir, "data", "postmaster.pid"))
	require.ErrorIs(t, err, os.ErrNotExist, "dev stops the cluster it started")

	// Asked (--edge-tls-*), dev's edge serves HTTPS and its default catalog's origins are https://.
	pair := testpki.NewCA(t, "dev-edge").Server(t, "dev-edge", "*.workers.localhost")
	second := startDev(t, dir, "--edge-tls-cert", pair.CertFile, "--edge-tls-key", pair.KeyFile)
	require.Contains(t, second.stdout.String(), "(https://<hostname>:<port>/)")
	again, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	require.Equal(t, string(raw), string(again), "the second run reuses the cluster and its key")
	require.Equal(t, http.StatusOK, capabilities(t, second.url, key))
	second.stop(t)
}

// devServesAWorker puts a worker and an endpoint (its reservation minted by the Host) through dev's
// API, and fetches the worker at its hostname through dev's edge, as a user following the
// README's dev instructions does.
func devServesAWorker(t *testing.T, d devProcess, key string) {
	t.Helper()
	m := regexp.MustCompile(`edge, (\S+) \(`).FindStringSubmatch(d.stdout.String())
	require.NotNil(t, m, "dev says where its edge listens: %s", d.stdout.String())
	worker := `{"modules":{"index.js":"export default { async fetch() { return new Response('hello from dev') } }"},"mainModule":"index.js","compatibilityDate":"2025-01-01","requiredSensitiveVars":[]}`
	w, err := put(d.url+"/v1/spaces/demo/workers/hello", key, "token-dev-worker-000001", worker)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, w.status, w.body)
	e, err := put(d.url+"/v1/spaces/demo/worker-endpoints/hello", key, "token-dev-endpoint-0001", `{"worker":"hello"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, e.status, e.body)
	var endpoint struct {
		Hostname string `json:"hostname"`
	}
	require.NoError(t, json.Unmarshal([]byte(e.body), &endpoint))
	require.NotEmpty(t, endpoint.Hostname, e.body)
	var last string
	served := assert.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodGet, "http://"+m[1]+"/", nil)
		if err != nil {
			return false
		}
		req.Host = endpoint.Hostname
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			last = err.Error()
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		return resp.StatusCode == http.StatusOK && string(body) == "hello from dev"
	}, 30*time.Second, 100*time.Millisecond)
	require.True(t, served, "dev's edge serves the worker at %s: last answer %s", endpoint.Hostname, last)
}

// TestADevKilledLeavesNoClusterRunningPastTheNext (issue 32 item 9): one dev runs per directory
// (a second is refused, naming the first); a dev killed with SIGKILL leaves its cluster running,
// and the next dev says so, uses it and stops it when it stops; a busy address names the flag
// that moves it.
func TestADevKilledLeavesNoClusterRunningPastTheNext(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	first := startDev(t, dir)
	_, errOut, err := runRaw("", "dev", "--dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0")
	require.Error(t, err)
	require.Contains(t, errOut, fmt.Sprintf("another takoserver dev (pid %d) is using", first.cmd.Process.Pid))

	require.NoError(t, first.cmd.Process.Kill())
	_ = first.cmd.Wait()
	_, err = os.Stat(filepath.Join(dir, "data", "postmaster.pid"))
	require.NoError(t, err, "a killed dev leaves its cluster running")

	second := startDev(t, dir)
	require.Contains(t, second.stderr.String(), "left running by an earlier takoserver dev")
	second.stop(t)
	_, err = os.Stat(filepath.Join(dir, "data", "postmaster.pid"))
	require.ErrorIs(t, err, os.ErrNotExist, "the next dev stops the cluster the killed one left")

	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	for flag, args := range map[string][]string{
		"--listen":       {"--listen", busy.Addr().String(), "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0"},
		"--admin-listen": {"--listen", "127.0.0.1:0", "--admin-listen", busy.Addr().String(), "--edge-listen", "127.0.0.1:0"},
		"--edge-listen":  {"--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--edge-listen", busy.Addr().String()},
	} {
		_, errOut, err := runRaw("", append([]string{"dev", "--dir", dir, "--workerd", workerdtest.Binary(t),
			"--runtime-state-dir", filepath.Join(filepath.Dir(dir), "runtime")}, args...)...)
		require.Error(t, err, flag)
		require.Contains(t, errOut, "pick another address with "+flag, "a busy %s names its flag: %s", flag, errOut)
	}
}

func TestDevRefusesUnsafeDirectory(t *testing.T) {
	t.Parallel()
	dir := devDir(t)
	require.NoError(t, os.Mkdir(dir, 0o755))
	require.NoError(t, os.Chmod(dir, 0o755))
	_, errOut, err := runRaw("", "dev", "--dir", dir, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--edge-listen", "127.0.0.1:0")
	require.Error(t, err)
	require.Contains(t, errOut, "refusing unsafe private path")
	info, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), info.Mode().Perm(), "never repaired")
}

// TestDeploymentBrakeRefusesMutationsAndKeepsReads: a brake refuses graph-changing mutations in its
// scope only (the whole Host, an organization, one worker), on reservations, workers and
// endpoints, while reads continue and another organization is unaffected.
func TestDeploymentBrakeRefusesMutationsAndKeepsReads(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	run(t, url, "migrate", "up")
	run(t, url, "orgs", "create", "acme")
	run(t, url, "orgs", "create", "other")
	key := decodeJSON(t, run(t, url, "keys", "create", "--org", "acme", "--output", "json"))["key"].(string)
	otherKey := decodeJSON(t, run(t, url, "keys", "create", "--org", "other", "--output", "json"))["key"].(string)
	h := startHost(t, url, sealingKey(t), "--config", startRuntime(t).catalog(t))
	res := h.url + "/v1/worker-endpoint-origin-reservations/"
	worker := `{"modules":{"index.js":"export default { async fetch() { return new Response('hi') } }"},"mainModule":"index.js","compatibilityDate":"2025-01-01","requiredSensitiveVars":[]}`

	a, err := put(res+"res-a", key, "token-brake-0000000001", `{"space":"prod","workerName":"api"}`)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, a.status, a.body)
	w, err := put(h.url+"/v1/spaces/prod/workers/api", key, "token-brake-worker-0001", worker)
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, w.status, w.body)

	locked := func(a answer, err error) {
		t.Helper()
		require.NoError(t, err)
		require.Equal(t, http.StatusLocked, a.status, a.body)
		require.Contains(t, a.body, `"code":"deployment_brake"`)
	}
	allowed := func(a answer, err error, status int) {
		t.Helper()
		require.NoError(t, err)
		require.Equal(t, status, a.status, a.body)
	}

	// One worker's brake: that worker's mutations stop; the organization's others go on.
	require.Equal(t, true, decodeJSON(t, run(t, url, "brake", "deployment", "on", "--org", "acme", "--space", "prod", "--worker", "api", "--output", "json"))["engaged"])
	locked(put(h.url+"/v1/spaces/prod/workers/api", key, "token-brake-worker-0001", strings.Replace(worker, "2025-01-01", "2025-02-02", 1)))
	locked(put(h.url+"/v1/spaces/prod/worker-endpoints/api", key, "token-brake-endpoint-01", `{"worker":"api","originReservationId":"res-a"}`))
	// A delete names no worker in its request: the reservation's worker, read inside the
	// transaction, is the one the brake covers.
	locked(deleteWith(http.DefaultClient, res+"res-a", key, "token-brake-0000000001"))
	b, err := put(res+"res-b", key, "token-brake-0000000002", `{"space":"prod","workerName":"web"}`)
	allowed(b, err, http.StatusCreated)
	run(t, url, "brake", "deployment", "off", "--org", "acme", "--space", "prod", "--worker", "api")

	// The organization's brake: all of acme stops, other goes on.
	run(t, url, "brake", "deployment", "on", "--org", "acme")
	locked(put(res+"res-c", key, "token-brake-0000000003", `{"space":"prod","workerName":"db"}`))
	o, err := put(res+"res-o", otherKey, "token-brake-other-00001", `{"space":"prod","workerName":"api"}`)
	allowed(o, err, http.StatusCreated)
	run(t, url, "brake", "deployment", "off", "--org", "acme")

	// The whole Host's brake: everyone stops; reads continue.
	run(t, url, "brake", "deployment", "on")
	locked(put(res+"res-c", key, "token-brake-0000000003", `{"space":"prod","workerName":"db"}`))
	locked(put(res+"res-p", otherKey, "token-brake-other-00002", `{"space":"prod","workerName":"web"}`))
	req, err := http.NewRequest(http.MethodGet, res+"res-a", nil)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "reads continue under the brake")

	run(t, url, "brake", "deployment", "off")
	c, err := put(res+"res-c", key, "token-brake-0000000003", `{"space":"prod","workerName":"db"}`)
	allowed(c, err, http.StatusCreated)

	_, errOut, err := runRaw(url, "brake", "everything", "on")
	require.Error(t, err)
	require.Contains(t, errOut, "unknown brake")
	_, errOut, err = runRaw(url, "brake", "deployment", "on", "--space", "prod")
	require.Error(t, err)
	require.Contains(t, errOut, "--space and --worker go together")
}

// TestSixtyFourPutsForOneOriginHaveExactlyOneWinner: 64 concurrent PUTs for one origin, from 64
// organizations with different reservation ids, spread over two Host processes on one database,
// repeated 50 times: exactly one winner each time, no 5xx, never a second live row.
func TestSixtyFourPutsForOneOriginHaveExactlyOneWinner(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	run(t, url, "migrate", "up")
	ctx := context.Background()
	pool, err := store.Open(ctx, url)
	require.NoError(t, err)
	defer pool.Close()
	const orgs, rounds = 64, 50
	keys := make([]string, orgs)
	for i := range orgs {
		name := fmt.Sprintf("org-%02d", i)
		_, err := auth.CreateOrganization(ctx, pool, name)
		require.NoError(t, err)
		k, err := auth.CreateKey(ctx, pool, name, nil)
		require.NoError(t, err)
		keys[i] = k.Key
	}
	kek := sealingKey(t)
	hosts := []host{startHost(t, url, kek), startHost(t, url, kek)}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: orgs}}

	for round := range rounds {
		origin := fmt.Sprintf("race-%d", round)
		answers := make([]answer, orgs)
		errs := make([]error, orgs)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i := range orgs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				body := fmt.Sprintf(`{"space":"prod","workerName":"w%d","subdomain":%q}`, round, origin)
				answers[i], errs[i] = putWith(client, fmt.Sprintf("%s/v1/worker-endpoint-origin-reservations/res-%d-%d", hosts[i%2].url, round, i),
					keys[i], fmt.Sprintf("token-race-%04d-%04d", round, i), body)
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		for i := range orgs {
			require.NoError(t, errs[i])
			switch answers[i].status {
			case http.StatusCreated:
				winners++
			case http.StatusConflict:
				require.Contains(t, answers[i].body, `"code":"origin_taken"`)
			default:
				t.Fatalf("round %d request %d: unexpected %d %s", round, i, answers[i].status, answers[i].body)
			}
		}
		require.Equal(t, 1, winners, "round %d", round)
		var live int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM worker_endpoint_origin_reservations
			WHERE canonical_origin = $1 AND status IN ('prepared', 'bound', 'activated')`, "http://"+origin+".workers.localhost:8787").Scan(&live))
		require.Equal(t, 1, live, "round %d", round)
	}
}

func putWith(client *http.Client, url, key, token, body string) (answer, error) {
	return send(client, http.MethodPut, url, key, token, body)
}

func deleteWith(client *http.Client, url, key, token string) (answer, error) {
	return send(client, http.MethodDelete, url, key, token, "")
}

func send(client *http.Client, method, url, key, token, body string) (answer, error) {
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Takoform-Ownership-Token", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return answer{status: resp.StatusCode, replayed: resp.Header.Get("Takoform-Replayed"), body: string(raw)}, err
}

// TestSealingKeyFileAndRotation: init-sealing writes a 0600 key file and never overwrites one;
// rotation is one database write that says what replicas do; a Host given another key refuses to
// start instead of sealing under a key nobody else has.
func TestSealingKeyFileAndRotation(t *testing.T) {
	t.Parallel()
	url := testdb.URL(t)
	run(t, url, "migrate", "up")
	dir := t.TempDir()
	kek := filepath.Join(dir, "sealing-key")
	created := decodeJSON(t, run(t, "", "keys", "init-sealing", "--out", kek, "--output", "json"))
	require.Regexp(t, `^[0-9a-f]{16}$`, created["kekId"])
	info, err := os.Stat(kek)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	before, err := os.ReadFile(kek)
	require.NoError(t, err)
	_, errOut, err := runRaw("", "keys", "init-sealing", "--out", kek)
	require.Error(t, err)
	require.Contains(t, errOut, "never overwritten")
	after, err := os.ReadFile(kek)
	require.NoError(t, err)
	require.Equal(t, before, after)

	first := decodeJSON(t, run(t, url, "keys", "rotate-sealing", "--sealing-key-file", kek, "--output", "json"))
	second := decodeJSON(t, run(t, url, "keys", "rotate-sealing", "--sealing-key-file", kek, "--output", "json"))
	require.NotEqual(t, first["current"], second["current"])
	require.Contains(t, run(t, url, "keys", "rotate-sealing", "--sealing-key-file", kek), "no restart needed")

	other := sealingKey(t)
	_, errOut, err = runRaw(url, "serve", "--listen", "127.0.0.1:0", "--sealing-key-file", other)
	require.Error(t, err)
	require.Contains(t, errOut, "cannot unwrap the current data key")
	_, errOut, err = runRaw(url, "keys", "rotate-sealing", "--sealing-key-file", other)
	require.Error(t, err)
	require.Contains(t, errOut, "cannot unwrap the current data key")
	_, errOut, err = runRaw(url, "serve", "--listen", "127.0.0.1:0")
	require.Error(t, err)
	require.Contains(t, errOut, "keys init-sealing")

	// A leaked key-encryption key is retired: re-wrapped under a new one, a Host starts with the
	// new file, and no longer with the old one.
	rewrapped := decodeJSON(t, run(t, url, "keys", "rewrap", "--sealing-key-file", kek, "--new-kek", other, "--output", "json"))
	require.EqualValues(t, 6, rewrapped["rewrapped"], "four data keys (the current and three previous), the commitment secret and the custom-domain challenge secret")
	startHost(t, url, other)
	_, errOut, err = runRaw(url, "serve", "--listen", "127.0.0.1:0", "--sealing-key-file", kek)
	require.Error(t, err)
	require.Contains(t, errOut, "cannot unwrap the current data key")
}
