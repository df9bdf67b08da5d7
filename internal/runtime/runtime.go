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
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/supervisor"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// DefaultStateDir is where the runtime keeps its private state unless told otherwise.
var DefaultStateDir = filepath.Join(".takoform", "runtime")

// Config configures one runtime node. Zero values take the defaults of SPEC 5.
type Config struct {
	// StateDir is the private state directory (default .takoform/runtime).
	StateDir string
	// SealingKeyFile is the runtime's own sealing key, outside StateDir (SPEC 5.1); required.
	// CreateSealingKey is the dev path: a missing key file is created (or the key an earlier
	// version kept in StateDir is moved there once).
	SealingKeyFile   string
	CreateSealingKey bool
	// AdminListen and EdgeListen are the listen addresses (defaults 127.0.0.1:8788 and
	// 127.0.0.1:8787). AdminListener and EdgeListener, when set, are used instead (tests pass
	// port-0 listeners).
	AdminListen   string
	EdgeListen    string
	AdminListener net.Listener
	EdgeListener  net.Listener
	// AdminTLSCert and AdminTLSKey serve the admin API over TLS; a non-loopback admin address
	// requires them. AdminClientCA (PEM), with them, makes the admin API require a client
	// certificate issued by that CA (mutual TLS) before any request is read.
	AdminTLSCert  string
	AdminTLSKey   string
	AdminClientCA string
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
	LivenessPeriod    time.Duration // how often a Ready incarnation is probed (default 5s; SPEC 5.1)
	LivenessTimeout   time.Duration // how long one liveness probe may take (default 2s)

	// EgressDeny lists networks (CIDR) no worker may reach, beyond workerd's non-public ranges
	// and this node's own addresses (--egress-deny, SPEC 5.1).
	EgressDeny []string
	// SubrequestLimit caps each incarnation's concurrent subrequests (default 50).
	SubrequestLimit int
	// EdgeTLS serves the edge over HTTPS (--edge-tls-*, --edge-acme-*, --edge-http-listen).
	EdgeTLS edge.TLSOptions
	// Edge bounds what one client may take of the edge: timeouts, header and body sizes, and
	// the proxies whose forwarding headers are believed (SPEC 5.1; zero values take the
	// defaults of package edge).
	Edge edge.Limits
}

// Info tells an embedding caller how to reach a running node.
type Info struct {
	// AdminURL is the admin API's base URL (http:// or https://).
	AdminURL string
	// TokenFile holds the admin API's bearer token.
	TokenFile string
	// EdgeAddr is the edge's listen address (host:port); EdgeScheme is http or https, and
	// EdgeHTTPAddr the plain-HTTP redirect listener beside an HTTPS edge ("" when none).
	EdgeAddr     string
	EdgeScheme   string
	EdgeHTTPAddr string
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

	mu sync.RWMutex
	// deny is the egress deny list every new config carries (package egress); n.mu guards it.
	// denyGen counts its changes: a script's cached identity is for one generation of it.
	deny      []string
	denyGen   uint64
	published []string // the edge's addresses, denied to workers too
	desired   *state.Desired
	scripts   map[string]*scriptRun
	// byUID names the script of each worker UID desired (for service bindings), kept by
	// reconcileLocked; lookups check it against the desired state.
	byUID   map[string]string
	closing bool

	// stopping holds, by script, the incarnations retired and not yet stopped (guarded by mu).
	stopping map[string]map[*supervisor.Incarnation]bool
	// lineBudgets holds each organization's output-line budget, by its label.
	lineBudgets sync.Map
	// logs holds each worker UID's log ring (guarded by mu): created with its first incarnation,
	// dropped with its script.
	logs map[string]*workerlog.Ring

	// kick wakes the reconciler for the scripts in dirty: those whose incarnations changed state,
	// or whose candidate's start backoff ended (dirty guarded by kickMu, never held with mu).
	kick   chan struct{}
	kickMu sync.Mutex
	dirty  map[string]bool
	// waits holds, by script name, the channel that script's status long polls wait on: closed,
	// and removed, when its status may have moved, so that a change wakes only its own script's
	// polls; removed too when its last poll stops waiting (guarded by waitMu, taken with mu held).
	waitMu sync.Mutex
	waits  map[string]*waiters
	// statusWakes counts the status long polls woken (tests read it).
	statusWakes atomic.Int64
	retiring    sync.WaitGroup
	admin       *http.Server
	edge        *edge.Server
	served      chan error
	stopped     chan struct{}
	// quitting is closed when Close begins: log long polls answer at once.
	quitting chan struct{}
	closeOne sync.Once

	// edgeTLS is the edge's HTTPS (nil: plain HTTP); edgeHTTP serves edgeHTTPL, the redirect
	// listener beside it.
	edgeTLS   *edge.TLS
	edgeHTTP  *http.Server
	edgeHTTPL net.Listener
	// edgeHandler is the edge behind n.edge.
	edgeHandler *edge.Handler
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
	closeInheritedOnExec()
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
	if cfg.AdminClientCA != "" && cfg.AdminTLSCert == "" {
		return nil, errors.New("--admin-client-ca needs --admin-tls-cert and --admin-tls-key: client certificates are asked for in a TLS handshake")
	}
	if err := cfg.EdgeTLS.Validate(); err != nil {
		return nil, err
	}
	store, err := state.Open(cfg.StateDir, state.SealingKey{File: cfg.SealingKeyFile, CreateIfAbsent: cfg.CreateSealingKey})
	if err != nil {
		return nil, err
	}
	if moved := store.MovedLegacyKey(); moved != "" {
		log.Warn("moved the runtime's sealing key out of its state directory (SPEC 5.1)", "from", moved, "to", cfg.SealingKeyFile)
	}
	n := &Node{
		cfg: cfg, log: log, store: store, reg: prometheus.NewRegistry(),
		scripts: map[string]*scriptRun{}, byUID: map[string]string{}, stopping: map[string]map[*supervisor.Incarnation]bool{}, logs: map[string]*workerlog.Ring{}, kick: make(chan struct{}, 1), dirty: map[string]bool{}, waits: map[string]*waiters{},
		served: make(chan error, 3), stopped: make(chan struct{}), quitting: make(chan struct{}),
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
	if n.cfg.EgressDeny, err = egress.ParseDeny(cfg.EgressDeny); err != nil {
		return nil, err
	}
	edgeHandler := edge.New(n, n.reg, log, cfg.Edge)
	n.sup = supervisor.Options{
		Workerd: bin, Logger: log, Backoff: cfg.RestartBackoff, MaxBackoff: cfg.MaxRestartBackoff,
		ProbeDeadline: cfg.ProbeDeadline, LivenessPeriod: cfg.LivenessPeriod, LivenessTimeout: cfg.LivenessTimeout,
		SubrequestLimit: cfg.SubrequestLimit, Local: edgeHandler, Bindings: bindingRouter{n, edgeHandler},
		Changed:   func(i *supervisor.Incarnation) { n.nudge(i.Script()) },
		Restarted: func(i *supervisor.Incarnation) { n.metrics.restarts.WithLabelValues(i.Script()).Inc() },
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
	if err := n.openEdgeTLS(edgeHandler, edgeL); err != nil {
		adminL.Close()
		edgeL.Close()
		return nil, err
	}
	n.published = []string{edgeL.Addr().String(), n.cfg.EdgeListen}
	if addr := n.edgeHTTPAddr(); addr != "" {
		n.published = append(n.published, addr)
	}
	if n.deny, err = egress.DenyList(n.published, n.cfg.EgressDeny); err != nil {
		adminL.Close()
		edgeL.Close()
		_ = n.closeEdgeTLS(context.Background())
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
	n.edge = edge.NewH1Server(edgeHandler, cfg.Edge, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	n.edgeHandler = edgeHandler
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		adminL = tls.NewListener(adminL, tlsConfig)
	}
	go func() { n.served <- serveErr("admin API", n.admin.Serve(adminL)) }()
	go func() { n.served <- serveErr("edge", n.serveEdge(edgeL)) }()
	n.info = Info{AdminURL: scheme + "://" + adminL.Addr().String(), TokenFile: store.TokenFile(), EdgeAddr: edgeL.Addr().String(), StateDir: store.Dir(),
		EdgeScheme: n.edgeScheme(), EdgeHTTPAddr: n.edgeHTTPAddr()}
	log.Info("runtime node started", "admin", n.info.AdminURL, "edge", n.info.EdgeAddr, "edgeScheme", n.info.EdgeScheme, "stateDir", n.info.StateDir, "workerd", bin, "scripts", len(n.desired.Scripts), "routes", len(n.desired.Routes), "sandbox", n.sandboxMode())
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
		if n.cfg.AdminClientCA != "" {
			pem, err := os.ReadFile(n.cfg.AdminClientCA)
			if err != nil {
				return nil, nil, nil, fmt.Errorf("admin client CA: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, nil, nil, fmt.Errorf("admin client CA %s holds no PEM certificate", n.cfg.AdminClientCA)
			}
			tlsConfig.ClientCAs, tlsConfig.ClientAuth = pool, tls.RequireAndVerifyClientCert
		}
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
		close(n.quitting)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = errors.Join(n.admin.Shutdown(ctx), n.edge.Shutdown(ctx), n.closeEdgeTLS(ctx))
		n.shutdownIncarnations()
		n.edgeHandler.CloseIdle()
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

// nudge asks the reconciler to look at one script again (one of its incarnations changed state).
// It never waits for n.mu: an incarnation may change state, and call it, while n.mu is held.
func (n *Node) nudge(script string) {
	n.kickMu.Lock()
	n.dirty[script] = true
	n.kickMu.Unlock()
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// waitLocked is what a status long poll of script waits on (n.mu held, for reading or writing):
// it is closed by the next signal of that script. Taken under the same hold of n.mu as the status
// the poll read, it misses no change. The poll says doneWaiting when it stops waiting.
func (n *Node) waitLocked(script string) <-chan struct{} {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	w := n.waits[script]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		n.waits[script] = w
	}
	w.n++
	return w.ch
}

// doneWaiting ends one long poll's wait on ch: a script's channel is kept only while polls wait on
// it, so names polled once (an absent script's, say) leave nothing behind.
func (n *Node) doneWaiting(script string, ch <-chan struct{}) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	if w := n.waits[script]; w != nil && w.ch == ch {
		if w.n--; w.n == 0 {
			delete(n.waits, script)
		}
	}
}

// waiters is one script's status long polls: the channel they wait on and how many do.
type waiters struct {
	ch chan struct{}
	n  int
}

// signalLocked wakes the status long polls of the scripts named, or of every script when none is
// (n.mu held for writing).
func (n *Node) signalLocked(scripts ...string) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	if len(scripts) == 0 {
		for name, w := range n.waits {
			close(w.ch)
			delete(n.waits, name)
		}
		return
	}
	for _, name := range scripts {
		if w := n.waits[name]; w != nil {
			close(w.ch)
			delete(n.waits, name)
		}
	}
}

// denyRefresh is how often the node's addresses are read again for the egress deny list.
const denyRefresh = 30 * time.Second

func (n *Node) reconciler() {
	refresh := time.NewTicker(denyRefresh)
	defer refresh.Stop()
	for {
		select {
		case <-n.stopped:
			return
		case <-refresh.C:
			n.refreshDeny()
		case <-n.kick:
			n.kickMu.Lock()
			dirty := n.dirty
			n.dirty = map[string]bool{}
			n.kickMu.Unlock()
			// Only the scripts whose incarnations moved: a node's other tenants cost a kick
			// nothing, however many scripts they hold.
			n.mu.Lock()
			for name := range dirty {
				if _, ok := n.scripts[name]; ok && !n.closing {
					n.reconcileLocked(name)
				}
				// An incarnation of it changed state (that is what kicks): its status may have too.
				n.signalLocked(name)
			}
			n.mu.Unlock()
		}
	}
}

// refreshDeny reads the node's addresses again. When they changed, every script's desired
// incarnation is a new identity (its config carries the deny list): each starts as a candidate
// and takes over as an update does, so no worker keeps running with a stale list for long.
func (n *Node) refreshDeny() {
	deny, err := egress.DenyList(n.published, n.cfg.EgressDeny)
	if err != nil {
		n.log.Error("refresh the egress deny list", "error", err)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.moveToDenyLocked(deny)
}

// moveToDenyLocked makes deny the list every config carries (n.mu held for writing): each
// script's desired identity is then new, and its incarnation moves to a config with it.
func (n *Node) moveToDenyLocked(deny []string) {
	if slices.Equal(deny, n.deny) || n.closing {
		return
	}
	n.log.Info("this node's addresses changed: workers move to configs with the new egress deny list", "deny", len(deny))
	n.deny = deny
	n.denyGen++
	for name := range n.scripts {
		n.reconcileLocked(name)
	}
	n.signalLocked()
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

// closeInheritedOnExec marks every descriptor above standard error close-on-exec, so that none the
// node inherited from whatever started it (a shell, a supervisor) reaches a sandbox: Go opens its
// own with close-on-exec, and hands workerd its sockets explicitly. close_range(2) with
// CLOSE_RANGE_CLOEXEC needs Linux 5.11; an older kernel refuses it, and the node goes on.
func closeInheritedOnExec() {
	const sysCloseRange, closeRangeCloexec = 436, 1 << 2
	_, _, _ = syscall.Syscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec)
}
