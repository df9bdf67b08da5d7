package provider_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

// takoserverBinary builds takoserver once for the tests that run it as processes.
var takoserverBinary = sync.OnceValues(func() (string, error) {
	out := filepath.Join(providerDir, "takoserver")
	build := exec.Command("go", "build", "-o", out, "../server/cmd/takoserver")
	b, err := build.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("build takoserver: %v\n%s", err, b)
	}
	return out, nil
})

// replica is one `takoserver serve` process.
type replica struct {
	cmd  *exec.Cmd
	url  string
	logs *strings.Builder
	mu   *sync.Mutex
}

func startReplica(t *testing.T, dbURL, catalog, kek string) *replica {
	t.Helper()
	bin, err := takoserverBinary()
	require.NoError(t, err)
	cmd := exec.Command(bin, "serve", "--listen", "127.0.0.1:0", "--config", catalog, "--sealing-key-file", kek, "--janitor-every", "1s")
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "TAKOSERVER_DATABASE_URL="+dbURL)
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	cmd.Stdout = io.Discard
	require.NoError(t, cmd.Start())
	r := &replica{cmd: cmd, logs: &strings.Builder{}, mu: &sync.Mutex{}}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("takoserver serve (pid %d) log:\n%s", cmd.Process.Pid, r.log())
		}
	})
	addr := make(chan string, 1)
	listening := regexp.MustCompile(`"msg":"takoserver listening"[^\n]*"address":"([^"]+)"`)
	go func() {
		lines := bufio.NewScanner(stderr)
		lines.Buffer(make([]byte, 1<<20), 1<<20)
		for lines.Scan() {
			r.mu.Lock()
			r.logs.WriteString(lines.Text() + "\n")
			r.mu.Unlock()
			if m := listening.FindStringSubmatch(lines.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	select {
	case a := <-addr:
		r.url = "http://" + a
	case <-time.After(60 * time.Second):
		t.Fatal("the Host never said where it listens")
	}
	require.Eventually(t, func() bool {
		resp, err := http.Get(r.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, 60*time.Second, 50*time.Millisecond)
	return r
}

func (r *replica) log() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.logs.String()
}

// heldNode stands in front of a runtime node's admin API: it can hold the next script PUT until
// told to forward it, and counts the secret deliveries it forwards.
type heldNode struct {
	*httptest.Server
	armed      atomic.Bool
	held       chan struct{}
	release    chan struct{}
	deliveries atomic.Int64
}

func newHeldNode(t *testing.T, adminURL string) *heldNode {
	t.Helper()
	u, err := url.Parse(adminURL)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	n := &heldNode{held: make(chan struct{}, 1), release: make(chan struct{})}
	n.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets") {
			n.deliveries.Add(1)
		}
		if r.Method == http.MethodPut && strings.HasPrefix(r.URL.Path, "/v1/scripts/") && !strings.HasSuffix(r.URL.Path, "/secrets") && n.armed.CompareAndSwap(true, false) {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			n.held <- struct{}{}
			<-n.release
			// Its Host is gone: the deployment lands all the same, on a context of its own.
			r = r.Clone(context.Background())
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			r.ContentLength = int64(len(body))
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(n.Close)
	return n
}

// front is the provider's endpoint: a load balancer over the replicas that sends everything to
// the current one, and resets a client's connection whose replica died under it.
type front struct {
	*httptest.Server
	target atomic.Pointer[url.URL]
}

func newFront(t *testing.T, to string) *front {
	t.Helper()
	f := &front{}
	f.use(to)
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(f.target.Load()) },
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, _ error) {
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close()
			}
		},
	}
	f.Server = httptest.NewServer(rp)
	t.Cleanup(f.Close)
	return f
}

func (f *front) use(to string) {
	u, err := url.Parse(to)
	if err != nil {
		panic(err)
	}
	f.target.Store(u)
}

// Issue 34 item 1, with real processes: two `takoserver serve` replicas behind a load balancer,
// and the replica holding an update that consumes a new runtime input is killed (SIGKILL) while
// its deployment is at the runtime node. The provider's apply replays its request on the other
// replica, which recovers the dead one's operation once its lease has run out, and the same apply
// finishes: the worker serves the new secret, delivered once.
func TestAccAReplicaKilledMidUpdateLeavesTheApplyToFinish(t *testing.T) {
	requireCLI(t)
	dbURL := testdb.URL(t)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	kek := filepath.Join(t.TempDir(), "sealing-key")
	_, err = sealing.WriteKEKFile(kek)
	require.NoError(t, err)
	bin, err := takoserverBinary()
	require.NoError(t, err)
	migrate := exec.Command(bin, "migrate", "up")
	migrate.Env = append(os.Environ(), "TAKOSERVER_DATABASE_URL="+dbURL)
	out, err := migrate.CombinedOutput()
	require.NoError(t, err, "%s", out)
	org, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	key, err := auth.CreateKey(ctx, db, "acme", nil)
	require.NoError(t, err)

	node := runtimetest.Start(t)
	admin := newHeldNode(t, node.Info.AdminURL)
	catalog := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(catalog, []byte(fmt.Sprintf(`{
  "installations": [{"name": "selfhost", "pack": "selfhost", "endpointSuffix": "workers.localhost", "runtimeUrl": %q, "runtimeTokenFile": %q, "edgeListen": %q, "scheme": "http"}],
  "offerings": [
    {"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": ["*"]},
    {"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": ["*"]}
  ]
}`, admin.URL, node.Info.TokenFile, node.Info.EdgeAddr)), 0o600))
	a, b := startReplica(t, dbURL, catalog, kek), startReplica(t, dbURL, catalog, kek)
	lb := newFront(t, a.url)
	providerBlock := providerConfig(lb.URL, key.Key, org.ID)

	killed := make(chan struct{})
	var before int64
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: providerBlock + graph("prod", "app", "abc", 1),
		}, {
			PreConfig: func() {
				before = admin.deliveries.Load()
				admin.armed.Store(true)
				go func() {
					defer close(killed)
					select {
					case <-admin.held:
					case <-time.After(2 * time.Minute):
						return
					}
					require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
					_ = a.cmd.Wait()
					lb.use(b.url)
					close(admin.release)
					// The dead replica's lease runs out by database time.
					_, err := db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES ('2 minutes'::interval)
						ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
					require.NoError(t, err)
				}()
			},
			// A bounded update: a replay that can never finish fails the test in minutes, not at
			// the default ten.
			Config: providerBlock + strings.Replace(graph("prod", "app", "abcdefgh", 2),
				"  runtime_input_reference = takoform_worker_runtime_input.ri.reference\n",
				"  runtime_input_reference = takoform_worker_runtime_input.ri.reference\n  timeouts {\n    update = \"90s\"\n  }\n", 1),
			Check: func(*terraform.State) error {
				<-killed
				if admin.armed.Load() {
					return fmt.Errorf("the update's deployment never reached the node")
				}
				var host string
				if err := db.QueryRow(ctx, `SELECT hostname FROM worker_endpoints WHERE status = 'live'`).Scan(&host); err != nil {
					return err
				}
				code, body, _, err := node.TryGet(host, "/")
				if err != nil || code != http.StatusOK || body != "hello, 8" {
					return fmt.Errorf("the worker does not serve the new secret: %d %q %v", code, body, err)
				}
				if got := admin.deliveries.Load(); got != before+1 {
					return fmt.Errorf("the new input was delivered %d times", got-before)
				}
				var abandoned int
				if err := db.QueryRow(ctx, `SELECT count(*) FROM operations WHERE code = 'abandoned'`).Scan(&abandoned); err != nil || abandoned != 1 {
					return fmt.Errorf("the dead replica's operation is not recorded abandoned (%d, %v)", abandoned, err)
				}
				return nil
			},
		}},
	})
}
