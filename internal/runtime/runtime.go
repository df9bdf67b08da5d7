// Package runtime is the runtime node (`takoserver runtime`, SPEC 5): it keeps its own desired
// state, runs each script's incarnation as an isolate in its organization's workerd process
// (package orgproc), serves workers at their hostnames through its edge, carries their
// subrequests through its egress, and is driven by the Host's selfhost backend over its admin API
// (package adminapi). It imports nothing of the Host's domain or store.
//
// The node's parts: runtime.go starts and stops it and owns its listeners; reconcile.go moves each
// script towards its desired state; identity.go derives an incarnation's identity; status.go
// answers what a script and a route are doing now; outbound.go serves what workers send out;
// admin*.go are the admin API's handlers.
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
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/netutil"

	"github.com/takoform/terraform-provider-takoform/internal/netlisten"
	"github.com/takoform/terraform-provider-takoform/internal/poolkey"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sourcemaps"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// DefaultStateDir is where the runtime keeps its private state unless told otherwise.
var DefaultStateDir = filepath.Join(".takoform", "runtime")

// Config configures one runtime node. Zero values take the defaults of SPEC 5.
type Config struct {
	// StateDir is the private state directory (default .takoform/runtime).
	StateDir string
	// ChannelsDir is where each org process gets the directory of its sockets to the node,
	// bound into its sandbox: the organizations' uids must be able to traverse its path (default
	// <temporary directory>/takoform-runtime-<digest of the state directory's path>, made 0711).
	ChannelsDir string
	// SealingKeyFile is the runtime's own sealing key, outside StateDir (SPEC 5.1); required.
	// CreateSealingKey is the dev path: a missing key file is created (or the key an earlier
	// version kept in StateDir is moved there once).
	SealingKeyFile string
	// PreviousSealingKeyFile is the key SealingKeyFile replaces: deliveries sealed under it are
	// sealed again under the new key at start (a rotation that takes no worker down).
	PreviousSealingKeyFile string
	CreateSealingKey       bool
	// PoolKeyFile is the pool's private key (`takoserver nodes init-pool-key`, SPEC 6.2): with
	// it, the node opens the deliveries the Host sealed to its pool. Optional; a node without it
	// refuses a sealed delivery.
	PoolKeyFile string
	// PreviousPoolKeyFile is the pool key PoolKeyFile replaces (a rotation): blobs sealed to it
	// still open, and `takoserver nodes rotate-pool-key` re-seals them to the new one through the
	// node. Once every blob is re-sealed it may be dropped.
	PreviousPoolKeyFile string
	// AdminListen and EdgeListen are the listen addresses (defaults 127.0.0.1:8788 and
	// 127.0.0.1:8787). AdminListener and EdgeListener, when set, are used instead (tests pass
	// port-0 listeners).
	AdminListen   string
	EdgeListen    string
	AdminListener net.Listener
	EdgeListener  net.Listener
	// ListenWait is how long a listen address that is in use (the node's previous process still
	// holding it while it stops) is tried again before the start fails (zero: once).
	ListenWait time.Duration
	// AdminTLSCert and AdminTLSKey serve the admin API over TLS; a non-loopback admin address
	// requires them. AdminClientCA (PEM), with them, makes the admin API require a client
	// certificate issued by that CA (mutual TLS) before any request is read.
	AdminTLSCert  string
	AdminTLSKey   string
	AdminClientCA string
	// Workerd is the workerd binary; empty finds it (see workerd.Find).
	Workerd string
	// Processes, when set, runs the node's incarnations instead of sandboxed workerd (neither
	// workerd nor the sandbox is then looked for): the admin API's tests run without workerd.
	Processes NewProcesses
	Logger    *slog.Logger
	// Ready, when set, is called once both listeners are open.
	Ready func(Info)
	// Sandbox configures the OS sandbox and cgroup ceilings of every org process (SPEC 5.1).
	Sandbox sandbox.Config
	// InsecureNoSandbox runs every workerd as the node's own user, without namespaces or
	// ceilings, instead of refusing to start where the node cannot sandbox.
	InsecureNoSandbox bool
	// BeforeCode, when set, is called before an org process is given an isolate's code, with the
	// isolate's loader id (tests hold a load with it).
	BeforeCode func(loaderID string)

	// Tuning; tests shorten them.
	RestartBackoff    time.Duration // first restart delay of a process (default 250ms), doubling
	MaxRestartBackoff time.Duration // restart delay cap (default 30s)
	ProbeDeadline     time.Duration // how long one process start, and one incarnation's probe, may take (default 30s)
	DrainTimeout      time.Duration // how long an incumbent may finish its requests (default 30s)
	LivenessPeriod    time.Duration // how often an org process is probed (default 1s; SPEC 5.1)
	LivenessTimeout   time.Duration // how long one liveness probe may take (default, and at most, three quarters of the period)
	StalledSuspectFor time.Duration // how long an organization yields the CPU after liveness killed its process (default 1m; negative: not at all)
	LoadAllowance     time.Duration // how long a load the runtime asked for may hold its process's thread before missed probes count (default 10s)
	// DrainGrace is how long a stopping node keeps serving after its edge's GET /healthz began
	// to fail, so that load balancers take it out first (0: it stops at once).
	DrainGrace time.Duration
	// HeapLimitMB is V8's heap limit per isolate (default 128, Cloudflare's per worker): an
	// isolate past it ends its process.
	HeapLimitMB int
	// RecycleSecretsAfter is how long after a worker's secrets were replaced (or it was deleted)
	// its process is recycled, so that the values leave memory (default 10 minutes; SPEC 5:
	// within an hour).
	RecycleSecretsAfter time.Duration

	// EgressDeny lists networks (CIDR) no worker may reach, beyond the non-public ranges and
	// this node's own addresses (--egress-deny, SPEC 5.1).
	EgressDeny []string
	// SubrequestLimit caps each worker's concurrent subrequests (default 50), and
	// SubrequestsPerRequest what each request it serves may make (default 1,000).
	SubrequestLimit       int
	SubrequestsPerRequest int
	// WaitUntilAfter is how long after a worker's last response its ctx.waitUntil work may make
	// subrequests (default 30 s, Cloudflare's; tests shorten it).
	WaitUntilAfter time.Duration
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
	// StateDir is the absolute state directory, and ChannelsDir the directory under which each
	// org process gets its sockets to the node.
	StateDir    string
	ChannelsDir string
}

// Node is a running runtime node.
type Node struct {
	cfg   Config
	log   *slog.Logger
	store *state.Store
	procs Processes
	// pool opens pool deliveries (nil: the node has no pool key); poolPrevious the key it
	// replaces (nil: none).
	pool, poolPrevious *poolkey.Private
	// bin is the workerd binary, and channels the org processes' channels directory ("" both
	// when cfg.Processes runs the incarnations).
	bin, channels string
	sandbox       *sandbox.Sandbox // nil: --insecure-no-sandbox
	reg           *prometheus.Registry
	metrics       *metrics
	info          Info
	// policy is what workers' subrequests may reach, egress what carries them.
	policy *egress.Policy
	egress *egress.Egress

	mu      sync.RWMutex
	desired *state.Desired
	scripts map[string]*scriptRun
	// byUID names the script of each worker UID desired (for service bindings), kept by
	// reconcileLocked; lookups check it against the desired state.
	byUID   map[string]string
	closing bool

	// stopping holds, by script, the incarnations retired and not yet stopped (guarded by mu).
	stopping map[string]map[Incarnation]bool
	// lineBudgets holds each organization's output-line budget, by its label.
	lineBudgets sync.Map
	// logs holds each worker UID's log ring (guarded by mu): created with its first incarnation,
	// dropped with its script.
	logs map[string]*workerlog.Ring
	// sourceMaps keeps the node's parsed source maps, for the incarnations whose bundles have
	// them.
	sourceMaps *sourcemaps.Cache
	// ticks are the cron ticks run here, by tick id (each at most once).
	ticks ticks

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
	// statusWakes counts the status long polls woken (tests read it); logWaits the log long
	// polls waiting now.
	statusWakes atomic.Int64
	logWaits    atomic.Int64
	retiring    sync.WaitGroup
	admin       *http.Server
	edge        *edge.Server
	served      chan error
	stopped     chan struct{}
	// quitting is closed when Close begins: log long polls answer at once.
	quitting chan struct{}
	// draining: the node is stopping, and its health check fails while it still serves.
	draining atomic.Bool
	// member is the node's place in its pool (SPEC 6.2), as the Host last told it.
	member   membership
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
		n.Drain(cfg.DrainGrace)
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
	if cfg.ProbeDeadline <= 0 {
		// Here and not only in the process manager: the edge's wait for the restarted node's
		// workers is bounded by it too (zero would not wait at all).
		cfg.ProbeDeadline = 30 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.NewJSONHandler(os.Stderr, nil))
	}
	log = log.With("component", "runtime")
	// workerd is looked for first: a machine without it is told so before anything else.
	var bin string
	if cfg.Processes == nil {
		var err error
		if bin, err = workerd.Find(cfg.Workerd); err != nil {
			return nil, err
		}
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
	var pool, poolPrevious *poolkey.Private
	if cfg.PoolKeyFile != "" {
		var err error
		if pool, err = poolkey.ReadFile(cfg.PoolKeyFile); err != nil {
			return nil, err
		}
	}
	if cfg.PreviousPoolKeyFile != "" {
		var err error
		if poolPrevious, err = poolkey.ReadFile(cfg.PreviousPoolKeyFile); err != nil {
			return nil, err
		}
		if pool == nil || poolPrevious.Pool != pool.Pool {
			return nil, errors.New("--previous-pool-key-file needs --pool-key-file, a key of the same pool")
		}
	}
	store, err := state.Open(cfg.StateDir, state.SealingKey{File: cfg.SealingKeyFile, CreateIfAbsent: cfg.CreateSealingKey, Previous: cfg.PreviousSealingKeyFile})
	if err != nil {
		return nil, err
	}
	if moved := store.MovedLegacyKey(); moved != "" {
		log.Warn("moved the runtime's sealing key out of its state directory (SPEC 5.1)", "from", moved, "to", cfg.SealingKeyFile)
	}
	if cfg.PreviousSealingKeyFile != "" {
		log.Info("sealed the deliveries of the previous sealing key again under the new one; the previous key may now be dropped",
			"resealed", store.Resealed, "previous", cfg.PreviousSealingKeyFile, "current", cfg.SealingKeyFile)
	}
	n := &Node{
		cfg: cfg, log: log, store: store, pool: pool, poolPrevious: poolPrevious, reg: prometheus.NewRegistry(), bin: bin,
		scripts: map[string]*scriptRun{}, byUID: map[string]string{}, stopping: map[string]map[Incarnation]bool{}, logs: map[string]*workerlog.Ring{}, sourceMaps: sourcemaps.NewCache(sourcemaps.DefaultCacheSize), kick: make(chan struct{}, 1), dirty: map[string]bool{}, waits: map[string]*waiters{},
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
	if soft, hard, err := edge.RaiseDescriptorLimit(); err != nil {
		log.Warn("could not raise the descriptor limit", "error", err)
	} else {
		log.Info("descriptor limit", "soft", soft, "hard", hard)
	}
	if err := n.loadMembership(); err != nil {
		return nil, err
	}
	edgeHandler := edge.New(n, n.reg, log, cfg.Edge)
	edgeHandler.SetHealth(n.health)
	edgeHandler.SetRoutes(n.routes)
	n.edgeHandler = edgeHandler
	if n.desired, err = store.Load(); err != nil {
		return nil, err
	}
	if n.procs, err = n.startProcesses(); err != nil {
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
	published := []string{edgeL.Addr().String()}
	if !netlisten.Inherited(n.cfg.EdgeListen) {
		published = append(published, n.cfg.EdgeListen)
	}
	if addr := n.edgeHTTPAddr(); addr != "" {
		published = append(published, addr)
	}
	if n.policy, err = egress.NewPolicy(published, n.cfg.EgressDeny); err != nil {
		adminL.Close()
		edgeL.Close()
		_ = n.closeEdgeTLS(context.Background())
		return nil, err
	}
	n.egress = egress.New(n.policy, edgeHandler)
	n.mu.Lock()
	if n.desired.Version < state.IsolateVersion {
		n.upgradeAdmittedLocked()
	}
	for name := range n.desired.Scripts {
		n.resumeServingLocked(name)
		n.reconcileLocked(name)
	}
	n.mu.Unlock()
	go n.reconciler()
	// The edge opens once the processes of what the node served before its restart answer (or
	// soon, if some do not): its first clients find their workers serving (SPEC 5: a node is
	// back in about half a second).
	n.awaitResumed(cfg.ProbeDeadline)

	n.admin = &http.Server{Handler: n.adminHandler(), ReadHeaderTimeout: 10 * time.Second, TLSConfig: tlsConfig,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	n.edge = edge.NewH1Server(edgeHandler, cfg.Edge, slog.NewLogLogger(log.Handler(), slog.LevelWarn))
	total, perSource := n.edge.ConnCaps()
	log.Info("edge connection caps", "total", total, "perSource", perSource)
	// The admin API's connections are bounded (the Host holds one per log stream besides its
	// calls), so that it never takes the descriptors the node keeps for its probes.
	adminL = netutil.LimitListener(adminL, adminapi.MaxAdminConns)
	scheme := "http"
	if tlsConfig != nil {
		scheme = "https"
		adminL = tls.NewListener(adminL, tlsConfig)
	}
	go func() { n.served <- serveErr("admin API", n.admin.Serve(adminL)) }()
	go func() { n.served <- serveErr("edge", n.serveEdge(edgeL)) }()
	n.info = Info{AdminURL: scheme + "://" + adminL.Addr().String(), TokenFile: store.TokenFile(), EdgeAddr: edgeL.Addr().String(), StateDir: store.Dir(), ChannelsDir: n.channels,
		EdgeScheme: n.edgeScheme(), EdgeHTTPAddr: n.edgeHTTPAddr()}
	log.Info("runtime node started", "admin", n.info.AdminURL, "edge", n.info.EdgeAddr, "edgeScheme", n.info.EdgeScheme, "stateDir", n.info.StateDir, "workerd", n.bin, "scripts", len(n.desired.Scripts), "routes", len(n.desired.Routes), "sandbox", n.sandboxMode())
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
		if tlsConfig == nil && !netlisten.Inherited(n.cfg.AdminListen) && !loopbackAddress(n.cfg.AdminListen) {
			return nil, nil, nil, fmt.Errorf("admin address %s is not loopback: serving the admin API there needs --admin-tls-cert and --admin-tls-key", n.cfg.AdminListen)
		}
		if admin, err = n.listen(n.cfg.AdminListen, "admin API"); err != nil {
			return nil, nil, nil, fmt.Errorf("admin API: listen on %s: %w", n.cfg.AdminListen, err)
		}
	}
	if tlsConfig == nil && !loopbackAddress(admin.Addr().String()) {
		admin.Close()
		return nil, nil, nil, fmt.Errorf("admin listener %s is not loopback: serving the admin API there needs --admin-tls-cert and --admin-tls-key", admin.Addr())
	}
	edgeL = n.cfg.EdgeListener
	if edgeL == nil {
		if edgeL, err = n.listen(n.cfg.EdgeListen, "edge"); err != nil {
			admin.Close()
			return nil, nil, nil, fmt.Errorf("edge: listen on %s: %w", n.cfg.EdgeListen, err)
		}
	}
	return admin, edgeL, tlsConfig, nil
}

// listen opens addr, trying a busy address again for ListenWait, said once in the log.
func (n *Node) listen(addr, what string) (net.Listener, error) {
	return netlisten.Listen(context.Background(), addr, n.cfg.ListenWait, func(err error) {
		n.log.Warn("listen address in use; trying again", "listener", what, "address", addr, "for", n.cfg.ListenWait.String(), "error", err.Error())
	})
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

// startProcesses makes what runs the node's incarnations: cfg.Processes when set, otherwise
// orgproc's Manager over the pinned workerd, sandboxed unless the operator said not to.
func (n *Node) startProcesses() (Processes, error) {
	if n.cfg.Processes != nil {
		return n.cfg.Processes(n.nudge)
	}
	if err := n.openSandbox(n.bin); err != nil {
		return nil, err
	}
	var err error
	if n.channels, err = n.channelsDir(); err != nil {
		return nil, err
	}
	opts := n.processOptions(n.bin, n.channels)
	if opts.Records, err = n.readImplications(); err != nil {
		return nil, err
	}
	opts.Recorded = n.keepImplications
	m, err := orgproc.New(opts)
	if err != nil {
		return nil, err
	}
	return orgProcesses{m}, nil
}

// Info says how to reach the node.
func (n *Node) Info() Info { return n.info }

// health is what the edge's GET /healthz answers (SPEC 6.2): the node serves once its edge is
// open (after its workers resumed), until it drains or closes.
func (n *Node) health() (bool, string) {
	select {
	case <-n.quitting:
		return false, "the node is stopping"
	default:
	}
	if n.draining.Load() {
		return false, "the node is draining before it stops"
	}
	return n.memberHealth()
}

// Drain fails the health check and keeps serving for grace, so that load balancers stop sending
// before the edge closes (Run drains for Config.DrainGrace before it closes the node).
func (n *Node) Drain(grace time.Duration) {
	if grace <= 0 {
		return
	}
	n.draining.Store(true)
	n.log.Info("draining: the health check fails, the edge serves on until it stops", "grace", grace.String())
	time.Sleep(grace)
}

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

// shutdownIncarnations stops every org process, and with them every incarnation.
func (n *Node) shutdownIncarnations() {
	n.mu.Lock()
	n.closing = true
	n.mu.Unlock()
	if n.procs != nil {
		n.procs.Close()
	}
	n.retiring.Wait()
}

// closeInheritedOnExec marks every descriptor above standard error close-on-exec, so that none the
// node inherited from whatever started it (a shell, a supervisor) reaches a sandbox: Go opens its
// own with close-on-exec, and hands workerd its sockets explicitly. close_range(2) with
// CLOSE_RANGE_CLOEXEC needs Linux 5.11; an older kernel refuses it, and the node goes on.
func closeInheritedOnExec() {
	const sysCloseRange, closeRangeCloexec = 436, 1 << 2
	_, _, _ = syscall.Syscall(sysCloseRange, 3, ^uintptr(0), closeRangeCloexec)
}
