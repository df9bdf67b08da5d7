// Package runtimetest starts real runtime nodes (real workerd, port-0 listeners, a temporary state
// directory, captured logs) for tests of the runtime and of its clients.
package runtimetest

import (
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

// Harness is one running node and what a test needs to reach it.
type Harness struct {
	Node     *runtime.Node
	Info     runtime.Info
	StateDir string
	Logs     *Buffer
	cfg      runtime.Config
}

// Start runs a node on a fresh state directory. mutate, when given, adjusts the config first.
func Start(tb testing.TB, mutate ...func(*runtime.Config)) *Harness {
	tb.Helper()
	return start(tb, workerdtest.Binary(tb), mutate...)
}

func start(tb testing.TB, workerd string, mutate ...func(*runtime.Config)) *Harness {
	tb.Helper()
	cfg := runtime.Config{
		StateDir:          filepath.Join(tb.TempDir(), "runtime"),
		SealingKeyFile:    SealingKeyFile(tb),
		Workerd:           workerd,
		RestartBackoff:    30 * time.Millisecond,
		MaxRestartBackoff: 300 * time.Millisecond,
		ProbeDeadline:     15 * time.Second,
		DrainTimeout:      10 * time.Second,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	h := &Harness{StateDir: cfg.StateDir, Logs: &Buffer{}, cfg: cfg}
	h.start(tb)
	return h
}

func (h *Harness) start(tb testing.TB) {
	tb.Helper()
	cfg := h.cfg
	cfg.Logger = slog.New(slog.NewJSONHandler(h.Logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var err error
	// Listeners a test passed are used once; a restart gets fresh port-0 ones.
	if cfg.AdminListener == nil {
		cfg.AdminListener, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(tb, err)
	}
	if cfg.EdgeListener == nil {
		cfg.EdgeListener, err = net.Listen("tcp", "127.0.0.1:0")
		require.NoError(tb, err)
	}
	h.cfg.AdminListener, h.cfg.EdgeListener = nil, nil
	// A restart can find the previous node's state-directory lock still held for a moment on a
	// loaded machine (seen once in CI); it is asked again for a while, not taken as a failure.
	var node *runtime.Node
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		node, err = runtime.Start(cfg)
		if err == nil || !strings.Contains(err.Error(), "in use by another runtime node") || time.Now().After(deadline) {
			break
		}
	}
	require.NoError(tb, err)
	h.Node, h.Info = node, node.Info()
	tb.Cleanup(func() { _ = node.Close() })
}

// SealingKeyFile writes a fresh runtime sealing key into a private directory of its own (outside
// any state directory, SPEC 5.1) and returns its path.
func SealingKeyFile(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(tb.TempDir(), "keys")
	require.NoError(tb, os.Mkdir(dir, 0o700))
	path := filepath.Join(dir, "runtime-sealing-key")
	require.NoError(tb, state.WriteSealingKeyFile(path))
	return path
}

// Restart stops the node and starts another on the same state directory (new ports), as an
// operator restarting `takoserver runtime` with no Host running would.
func (h *Harness) Restart(tb testing.TB) {
	tb.Helper()
	h.RestartAfter(tb, func() {})
}

// RestartAfter stops the node, runs between (which may change its state directory, as an
// operator or an earlier version of the runtime would have left it), and starts it again.
func (h *Harness) RestartAfter(tb testing.TB, between func()) {
	tb.Helper()
	require.NoError(tb, h.Node.Close())
	between()
	h.start(tb)
}

// RestartInPlace is RestartAfter on the node's own admin and edge addresses, as an operator
// restarting a node where a Host and clients know it (between may empty its state directory).
func (h *Harness) RestartInPlace(tb testing.TB, between func()) {
	tb.Helper()
	admin, edge := strings.TrimPrefix(strings.TrimPrefix(h.Info.AdminURL, "http://"), "https://"), h.Info.EdgeAddr
	h.RestartAfter(tb, func() {
		between()
		var err error
		h.cfg.AdminListener, err = net.Listen("tcp", admin)
		require.NoError(tb, err)
		h.cfg.EdgeListener, err = net.Listen("tcp", edge)
		require.NoError(tb, err)
	})
}

// Config is the node's configuration (listeners aside).
func (h *Harness) Config() runtime.Config { return h.cfg }

// Get sends one request through the edge for hostname; any failure to get an answer fails tb.
func (h *Harness) Get(tb testing.TB, hostname, path string) (int, string, http.Header) {
	tb.Helper()
	code, body, header, err := h.TryGet(hostname, path)
	require.NoError(tb, err)
	return code, body, header
}

// TryGet is Get that returns its error instead of failing a test, for polling conditions and
// goroutines other than the test's.
func (h *Harness) TryGet(hostname, path string) (int, string, http.Header, error) {
	req, err := http.NewRequest(http.MethodGet, "http://"+h.Info.EdgeAddr+path, nil)
	if err != nil {
		return 0, "", nil, err
	}
	req.Host = hostname
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", nil, err
	}
	return resp.StatusCode, string(b), resp.Header, nil
}

// Buffer is a goroutine-safe log sink.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything logged so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
