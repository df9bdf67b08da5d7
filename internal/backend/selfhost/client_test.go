package selfhost_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

const source = `export default { async fetch(req, env) { return new Response("has key: " + (env.KEY !== undefined) + "\n"); } };`

func TestEveryRouteAgainstARealRuntimeNode(t *testing.T) {
	t.Parallel()
	h := runtimetest.Start(t)
	c, err := selfhost.New(h.Info.AdminURL, h.Info.TokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	st, err := c.PutScript(ctx, "api-test", adminapi.ScriptPut{
		EffectID: "e-1", WorkerUID: "uid-api", DeploymentID: "dep-1", Generation: 1,
		Labels:  adminapi.Labels{Organization: "o", Space: "s", Worker: "w"},
		Modules: map[string]string{"main.js": source}, MainModule: "main.js", CompatibilityDate: "2024-09-23",
		SecretNames: []string{"KEY"}, BundleDigest: "b1",
	})
	require.NoError(t, err)
	require.True(t, st.Present)
	require.Equal(t, []string{"KEY"}, st.SecretNames)

	_, err = c.PutSecrets(ctx, "api-test", adminapi.SecretsPut{EffectID: "e-2", WorkerUID: "uid-api", DeliveryID: "del-1", Values: map[string]vocab.Secret{"KEY": vocab.NewSecret("v")}})
	require.NoError(t, err)
	var lastErr error
	if !assert.Eventually(t, func() bool {
		got, err := c.GetScript(ctx, "api-test")
		if err != nil {
			lastErr = err
			return false
		}
		st = got
		return st.Ready
	}, 30*time.Second, 20*time.Millisecond) {
		t.Fatalf("never Ready: last status %+v, last error %v", st, lastErr)
	}
	require.Equal(t, "del-1", st.Incarnation.DeliveryID)

	challenge := []byte("0123456789abcdef0123456789abcdef")
	rb, err := c.Readback(ctx, "api-test", challenge, "")
	require.NoError(t, err)
	mac := hmac.New(sha256.New, challenge)
	mac.Write(canonjson.Marshal(map[string]string{"KEY": "v"}))
	require.Equal(t, hex.EncodeToString(mac.Sum(nil)), rb.Digest)

	rt, err := c.PutRoute(ctx, "api.workers.localhost", adminapi.RoutePut{EffectID: "e-3", ScriptName: "api-test", EndpointUID: "ep-1", DeploymentID: "dep-e"})
	require.NoError(t, err)
	require.True(t, rt.Present)
	rt, err = c.GetRoute(ctx, "api.workers.localhost")
	require.NoError(t, err)
	require.True(t, rt.Ready)
	code, body, _ := h.Get(t, "api.workers.localhost", "/")
	require.Equal(t, 200, code)
	require.Equal(t, "has key: true\n", body)

	brakes, err := c.SetLifecycleBrake(ctx, true, adminapi.BrakeScope{Organization: "o"})
	require.NoError(t, err)
	require.Len(t, brakes.Lifecycle, 1)
	brakes, err = c.Brakes(ctx)
	require.NoError(t, err)
	require.Len(t, brakes.Lifecycle, 1)
	status, err := c.Status(ctx)
	require.NoError(t, err)
	require.Len(t, status.Scripts, 1)
	require.Len(t, status.Routes, 1)
	require.Len(t, status.Brakes.Lifecycle, 1)

	// Erasing the delivery admits an incarnation without it; the script waits for a new one.
	st, err = c.DeleteSecrets(ctx, "api-test", "uid-api")
	require.NoError(t, err)
	require.False(t, st.Secrets.Delivered)
	_, err = os.Stat(filepath.Join(h.StateDir, "secrets", "uid-api"))
	require.ErrorIs(t, err, os.ErrNotExist)
	rb, err = c.Readback(ctx, "api-test", challenge, "")
	require.NoError(t, err)
	require.False(t, rb.Present)
	require.Empty(t, rb.Digest)

	rt, err = c.DeleteRoute(ctx, "api.workers.localhost", "api-test", "ep-1")
	require.NoError(t, err)
	require.False(t, rt.Present)
	st, err = c.DeleteScript(ctx, "api-test", "uid-api")
	require.NoError(t, err)
	require.False(t, st.Present)

	_, err = c.PutSecrets(ctx, "api-test", adminapi.SecretsPut{EffectID: "e-4", WorkerUID: "uid-api", DeliveryID: "del-2", Values: map[string]vocab.Secret{"KEY": vocab.NewSecret("v")}})
	var problem *selfhost.ProblemError
	require.ErrorAs(t, err, &problem)
	require.Equal(t, 404, problem.StatusCode)
	require.Equal(t, adminapi.CodeScriptAbsent, problem.Problem.Code)
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptAbsent))
	require.False(t, errors.Is(err, selfhost.ErrNodeUnreachable))

	bad := selfhost.NewWithToken(h.Info.AdminURL, "not-the-token")
	_, err = bad.Status(ctx)
	require.True(t, selfhost.IsCode(err, adminapi.CodeUnauthorized), "%v", err)
}

func TestUnreachableRuntimeIsRetriedThenReported(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())

	c := selfhost.NewWithToken("http://"+addr, "token")
	c.Attempts, c.Backoff = 3, 10*time.Millisecond
	_, err = c.Status(context.Background())
	require.ErrorIs(t, err, selfhost.ErrNodeUnreachable)

	// A node that comes up while the client retries answers the same call. Its address is held
	// throughout by one listener that resets every connection until it is handed to the node, so
	// no other process can take the port in between.
	down, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l2 := newHandover(down)
	c = selfhost.NewWithToken("http://"+down.Addr().String(), "token")
	c.Attempts, c.Backoff = 50, 20*time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := c.Status(context.Background())
		done <- err
	}()
	require.Eventually(t, func() bool { return l2.reset.Load() >= 2 }, 20*time.Second, 5*time.Millisecond, "the client retries a node that is down")
	h := runtimetest.Start(t, func(cfg *runtime.Config) { cfg.AdminListener = l2 })
	require.NotNil(t, h)
	select {
	case err := <-done:
		// The call reached the node; with the wrong token it is refused, which proves it got there.
		require.True(t, selfhost.IsCode(err, adminapi.CodeUnauthorized), "%v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the retried call never reached the node")
	}

	// A gateway in front of a node that is down answers for it: the node is unreachable. Any other
	// answer without a problem document is the node's refusal.
	for code, unreachable := range map[int]bool{http.StatusBadGateway: true, http.StatusServiceUnavailable: true, http.StatusGatewayTimeout: true,
		http.StatusInternalServerError: false, http.StatusNotFound: false} {
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "upstream down", code)
		}))
		c = selfhost.NewWithToken(gw.URL, "token")
		c.Attempts, c.Backoff = 2, time.Millisecond
		_, err = c.Status(context.Background())
		gw.Close()
		require.Equal(t, unreachable, errors.Is(err, selfhost.ErrNodeUnreachable), "%d: %v", code, err)
		var pe *selfhost.ProblemError
		require.Equal(t, !unreachable, errors.As(err, &pe), "%d: %v", code, err)
	}

	// A node the pool holds suspect is asked once, not waited on.
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, gone.Close())
	c = selfhost.NewWithToken("http://"+gone.Addr().String(), "token")
	c.Attempts, c.Backoff, c.Once = 100, time.Second, func() bool { return true }
	start := time.Now()
	_, err = c.Status(context.Background())
	require.ErrorIs(t, err, selfhost.ErrNodeUnreachable)
	require.Less(t, time.Since(start), time.Second, "one attempt, no backoff")

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	c = selfhost.NewWithToken("http://"+closed.Addr().String(), "token")
	c.Attempts, c.Backoff = 100, time.Second
	start = time.Now()
	_, err = c.Status(ctx)
	require.ErrorIs(t, err, selfhost.ErrNodeUnreachable)
	require.Less(t, time.Since(start), 5*time.Second, "the context bounds the retries")
}

func TestNewNeedsTheTokenFile(t *testing.T) {
	t.Parallel()
	_, err := selfhost.New("http://127.0.0.1:8788", filepath.Join(t.TempDir(), "missing"))
	require.ErrorContains(t, err, "admin token")
	empty := filepath.Join(t.TempDir(), "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	_, err = selfhost.New("http://127.0.0.1:8788", empty)
	require.ErrorContains(t, err, "empty")
}

// handover is a listener that resets every connection (a node that is down) until the first call
// to Accept, from then on serving them to its caller: the address stays held across the change.
type handover struct {
	net.Listener
	reset   atomic.Int64
	taken   chan struct{}
	once    sync.Once
	accepts chan net.Conn
}

func newHandover(l net.Listener) *handover {
	h := &handover{Listener: l, taken: make(chan struct{}), accepts: make(chan net.Conn)}
	go func() {
		defer close(h.accepts)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			select {
			case <-h.taken:
				h.accepts <- conn
			default:
				if tc, ok := conn.(*net.TCPConn); ok {
					_ = tc.SetLinger(0) // a reset, as from a node that is not there
				}
				_ = conn.Close()
				h.reset.Add(1)
			}
		}
	}()
	return h
}

func (h *handover) Accept() (net.Conn, error) {
	h.once.Do(func() { close(h.taken) })
	conn, ok := <-h.accepts
	if !ok {
		return nil, net.ErrClosed
	}
	return conn, nil
}

// A node's new admin token reaches a running Host without a restart (issue 34 item 3): after a
// 401 the client reads its token file again and, when it holds another token, tries once more
// with it. A token the file does not fix is logged as the node's refusal (naming the node and the
// file, never a token) and the call fails with the 401.
func TestARefusedTokenIsReadAgainFromItsFileAndARealRefusalIsLogged(t *testing.T) {
	t.Parallel()
	var want atomic.Value
	want.Store("token-one")
	var refusals atomic.Int32
	node := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+want.Load().(string) {
			refusals.Add(1)
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"type":"about:blank","title":"Unauthorized","status":401,"code":"unauthorized","detail":"bad token"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer node.Close()
	file := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(file, []byte("token-one\n"), 0o600))
	c, err := selfhost.New(node.URL, file)
	require.NoError(t, err)
	logs := &runtimetest.Buffer{}
	c.Log = slog.New(slog.NewJSONHandler(logs, nil))
	ctx := context.Background()
	_, err = c.Brakes(ctx)
	require.NoError(t, err)

	// The node's token is rotated and the file with it: one refusal, then the new token.
	want.Store("token-two")
	require.NoError(t, os.WriteFile(file, []byte("token-two\n"), 0o600))
	_, err = c.Brakes(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, refusals.Load())
	require.Contains(t, logs.String(), "read the token file again and took its new token")

	// The node's token moved and the file did not: the refusal stands and is logged.
	want.Store("token-three")
	_, err = c.Brakes(ctx)
	require.True(t, selfhost.IsCode(err, "unauthorized"), "%v", err)
	require.Contains(t, logs.String(), `"level":"ERROR","msg":"runtime node refused the Host's admin token (401)`)
	require.Contains(t, logs.String(), file)
	require.NotContains(t, logs.String(), "token-two")
	require.NotContains(t, logs.String(), "token-three")
}
