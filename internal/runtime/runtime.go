// Package runtime is the runtime node (`takoserver runtime`, SPEC 5): it keeps its own desired
// state, runs each script's incarnation in workerd under a supervisor, serves workers at their
// hostnames through its edge, and is driven by the Host's selfhost backend over its admin API
// (package adminapi). It imports nothing of the Host's domain or store.
//
// Run is the whole node; Start returns a running Node for callers that embed it (`takoserver dev`,
// tests).
package runtime

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/supervisor"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// DefaultStateDir is where the runtime keeps its private state unless told otherwise.
var DefaultStateDir = filepath.Join(".takoform", "runtime")

// Config configures one runtime node. Zero values take the defaults of SPEC 5.
type Config struct {
	// StateDir is the private state directory (default .takoform/runtime).
	StateDir string
	// AdminListen and EdgeListen are the listen addresses (defaults 127.0.0.1:8788 and
	// 127.0.0.1:8787). AdminListener and EdgeListener, when set, are used instead (tests pass
	// port-0 listeners).
	AdminListen   string
	EdgeListen    string
	AdminListener net.Listener
	EdgeListener  net.Listener
	// AdminTLSCert and AdminTLSKey serve the admin API over TLS; a non-loopback admin address
	// requires them.
	AdminTLSCert string
	AdminTLSKey  string
	// Workerd is the workerd binary; empty finds it (see workerd.Find).
	Workerd string
	Logger  *slog.Logger
	// Ready, when set, is called once both listeners are open.
	Ready func(Info)
	// Sandbox configures the OS sandbox and cgroup ceilings of every incarnation (SPEC 5.1).
	Sandbox sandbox.Config
	// InsecureNoSandbox runs every workerd as the node's own user, without namespaces or
	// ceilings, instead of refusing to start where the node cannot sandbox.
	InsecureNoSandbox bool

	// Tuning; tests shorten them.
	RestartBackoff    time.Duration // first restart delay (default 250ms), doubling
	MaxRestartBackoff time.Duration // restart delay cap (default 30s)
	ProbeDeadline     time.Duration // how long one start may take to answer a probe (default 30s)
	DrainTimeout      time.Duration // how long an incumbent may finish its requests (default 30s)
}

// Info tells an embedding caller how to reach a running node.
type Info struct {
	// AdminURL is the admin API's base URL (http:// or https://).
	AdminURL string
	// TokenFile holds the admin API's bearer token.
	TokenFile string
	// EdgeAddr is the edge's listen address (host:port).
	EdgeAddr string
	// StateDir is the absolute state directory.
	StateDir string
}

// Node is a running runtime node.
type Node struct {
	cfg     Config
	log     *slog.Logger
	store   *state.Store
	sup     supervisor.Options
	sandbox *sandbox.Sandbox // nil: --insecure-no-sandbox
	reg     *prometheus.Registry
	metrics *metrics
	info    Info

	mu      sync.RWMutex
	desired *state.Desired
	scripts map[string]*scriptRun
	closing bool

	kick     chan struct{}
	retiring sync.WaitGroup
	admin    *http.Server
	edge     *http.Server
	served   chan error
	stopped  chan struct{}
	closeOne sync.Once
}

// Run runs a node until ctx ends, then shuts it down cleanly: every workerd process stops and
// every incarnation directory is removed; the desired state stays for the next start.
func Run(ctx context.Context, cfg Config) error {
	n, err := Start(cfg)
	if err != nil {
		return err
	}
	if cfg.Ready != nil {
		cfg.Ready(n.Info())
	}
	var served error
	select {
	case <-ctx.Done():
	case served = <-n.served:
	}
	closeErr := n.Close()
	return errors.Join(served, closeErr)
}

// Start opens the state directory, starts the desired incarnations and both listeners, and
// returns the running node. Close stops it.
func Start(cfg Config) (*Node, error) {
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.AdminListen == "" {
		cfg.AdminListen = adminapi.DefaultAdminListen
	}
	if cfg.EdgeListen == "" {
		cfg.EdgeListen = adminapi.DefaultEdgeListen
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	log = log.With("component", "runtime")
	bin, err := workerd.Find(cfg.Workerd)
	if err != nil {
		return nil, err
	}
	if (cfg.AdminTLSCert == "") != (cfg.AdminTLSKey == "") {
		return nil, errors.New("--admin-tls-cert and --admin-tls-key go together")
	}
	store, err := state.Open(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, log: log, store: store, reg: prometheus.NewRegistry(),
		scripts: map[string]*scriptRun{}, kick: make(chan struct{}, 1),
		served: make(chan error, 2), stopped: make(chan struct{}),
	}
	ok := false
	defer func() {
		if !ok {
			n.shutdownIncarnations()
			n.closeSandbox()
			store.Close()
		}
	}()
	n.metrics = newMetrics(n)
	n.reg.MustRegister(n.metrics)
	n.sup = supervisor.Options{
		Workerd: bin, Logger: log, Backoff: cfg.RestartBackoff, MaxBackoff: cfg.MaxRestartBackoff,
		ProbeDeadline: cfg.ProbeDeadline,
		Changed:       func(*supervisor.Incarnation) { n.nudge() },
		Restarted:     func(i *supervisor.Incarnation) { n.metrics.restarts.WithLabelValues(i.Script()).Inc() },
	}
	if n.desired, err = store.Load(); err != nil {
		return nil, err
	}
	if err := n.openSandbox(bin); err != nil {
		return nil, err
	}
	n.sup.Sandbox = n.sandbox
	// Directories of incarnations a previous run left behind (it was killed) hold nothing that
	// must survive: every incarnation is started afresh from the desired state.
	if err := clearDir(store.IncarnationsDir()); err != nil {
		return nil, err
	}
	adminL, edgeL, tlsConfig, err := n.listeners()
	if err != nil {
		return nil, err
	}
	n.mu.Lock()
	for name := range n.desired.Scripts {
		n.resumeServingLocked(name)
		n.reconcileLocked(name)
	}
	n.mu.Unlock()
	go n.reconciler()

	n.admin = &http.Server{Handler: n.adminHandler(), ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	n.edge = &http.Server{Handler: edge.New(n, n.reg, log), ReadHeaderTimeout: 30 * time.Second,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		adminL = tls.NewListener(adminL, tlsConfig)
	}
	go func() { n.served <- serveErr("admin API", n.admin.Serve(adminL)) }()
	go func() { n.served <- serveErr("edge", n.edge.Serve(edgeL)) }()
	n.info = Info{AdminURL: scheme + "://" + adminL.Addr().String(), TokenFile: store.TokenFile(), EdgeAddr: edgeL.Addr().String(), StateDir: store.Dir()}
	log.Info("runtime node started", "admin", n.info.AdminURL, "edge", n.info.EdgeAddr, "stateDir", n.info.StateDir, "workerd", bin, "scripts", len(n.desired.Scripts), "routes", len(n.desired.Routes), "sandbox", n.sandboxMode())
	ok = true
	return n, nil
}

func serveErr(what string, err error) error {
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// listeners opens (or adopts) both listeners. A non-loopback admin address needs TLS (SPEC 5).
func (n *Node) listeners() (admin, edgeL net.Listener, tlsConfig *tls.Config, err error) {
	if n.cfg.AdminTLSCert != "" {
		cert, err := tls.LoadX509KeyPair(n.cfg.AdminTLSCert, n.cfg.AdminTLSKey)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("admin TLS: %w", err)
		}
		tlsConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	admin = n.cfg.AdminListener
	if admin == nil {
		if tlsConfig == nil && !loopbackAddress(n.cfg.AdminListen) {
			return nil, nil, nil, fmt.Errorf("admin address %s is not loopback: serving the admin API there needs --admin-tls-cert and --admin-tls-key", n.cfg.AdminListen)
		}
		if admin, err = net.Listen("tcp", n.cfg.AdminListen); err != nil {
			return nil, nil, nil, fmt.Errorf("admin API: listen on %s: %w", n.cfg.AdminListen, err)
		}
	} else if tlsConfig == nil && !loopbackAddress(admin.Addr().String()) {
		return nil, nil, nil, fmt.Errorf("admin listener %s is not loopback: serving the admin API there needs TLS", admin.Addr())
	}
	edgeL = n.cfg.EdgeListener
	if edgeL == nil {
		if edgeL, err = net.Listen("tcp", n.cfg.EdgeListen); err != nil {
			admin.Close()
			return nil, nil, nil, fmt.Errorf("edge: listen on %s: %w", n.cfg.EdgeListen, err)
		}
	}
	return admin, edgeL, tlsConfig, nil
}

func loopbackAddress(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Info says how to reach the node.
func (n *Node) Info() Info { return n.info }

// Close stops serving, stops every workerd process and removes every incarnation directory. The
// desired state stays on disk.
func (n *Node) Close() error {
	var err error
	n.closeOne.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(n.admin.Shutdown(ctx), n.edge.Shutdown(ctx))
		n.shutdownIncarnations()
		n.closeSandbox()
		close(n.stopped)
		n.store.Close()
		n.log.Info("runtime node stopped")
	})
	return err
}

func (n *Node) shutdownIncarnations() {
	n.mu.Lock()
	n.closing = true
	var all []*supervisor.Incarnation
	for _, r := range n.scripts {
		all = append(all, r.incarnations()...)
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	for _, inc := range all {
		wg.Add(1)
		go func() { defer wg.Done(); inc.Stop() }()
	}
	wg.Wait()
	n.retiring.Wait()
}

// nudge asks the reconciler to look at every script again (an incarnation changed state).
func (n *Node) nudge() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

func (n *Node) reconciler() {
	for {
		select {
		case <-n.stopped:
			return
		case <-n.kick:
			n.mu.Lock()
			if !n.closing {
				for name := range n.scripts {
					n.reconcileLocked(name)
				}
			}
			n.mu.Unlock()
		}
	}
}

func clearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return fmt.Errorf("remove stale incarnation directory: %w", err)
		}
	}
	return nil
}
