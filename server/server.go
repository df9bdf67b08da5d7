// Package server is the Host's HTTP layer: routing, authentication, decoding and problem
// responses. Domain rules live in internal/ packages; this package only wires them to HTTP.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
)

// DefaultBodyLimit bounds every request body.
const DefaultBodyLimit = 1 << 20

// Config is what a Host process needs.
type Config struct {
	DB      *pgxpool.Pool
	Catalog *catalog.Catalog
	Logger  *slog.Logger
	// BodyLimit bounds request bodies in bytes (1 MiB when zero).
	BodyLimit int64
	// TombstoneRetention is how long ownership tombstones are kept (30 days when zero).
	TombstoneRetention time.Duration
	// SealingRing seals runtime inputs; without one the runtime-input routes answer 501.
	SealingRing *sealing.Ring
	// RuntimeInputHooks stop a consumption at a precise point (tests only).
	RuntimeInputHooks runtimeinput.Hooks
	// OwnershipBusyWait is how long a request waits for an in-flight request on the same object
	// before answering intent_in_progress (2 s when zero).
	OwnershipBusyWait time.Duration
	// OwnershipLeaseTTL is how long a multi-transaction request's lease lasts without renewal
	// (60 s when zero): how soon another replica recovers the request of a Host that died.
	OwnershipLeaseTTL time.Duration
	// Holder names this process in lease rows (host name and process id when empty).
	Holder string
	// JanitorEvery is how often the janitor runs (a minute when zero).
	JanitorEvery time.Duration
	// KeyCacheTTL is how long a key that authenticated is trusted without asking the database
	// again: how soon a revocation reaches this replica (one second when zero; negative: never
	// cached).
	KeyCacheTTL time.Duration
	// WrapBackend wraps every backend mutator (tests only: to hold or fail a backend call).
	WrapBackend func(backend.Mutator) backend.Mutator
	// CloudflareEdge reaches Cloudflare's edge for the wfp-managed Ready probe (default: a plain
	// client); tests and demos resolve worker hostnames to a stand-in's edge with it.
	CloudflareEdge *http.Client
	// LogStreamsPerKey and LogStreamsPerOrganization cap the log follow streams open at once on
	// this replica (DefaultLogStreamsPerKey and DefaultLogStreamsPerOrganization when zero), and
	// LogStreamMaxAge ends a follow stream that has lasted that long (DefaultLogStreamMaxAge when
	// zero): its client reconnects with since.
	LogStreamsPerKey          int
	LogStreamsPerOrganization int
	LogStreamMaxAge           time.Duration
	// CloudflareBudget overrides the Cloudflare API budget's capacity, rate and organization share
	// (ratebudget's defaults where zero; tests make it small).
	CloudflareBudget ratebudget.Budget
}

// Server is one Host process's HTTP API.
type Server struct {
	cfg           Config
	log           *slog.Logger
	echo          *echo.Echo
	metrics       *metrics
	registry      *prometheus.Registry
	owners        *ownership.Manager
	reservations  *reservation.Service
	resources     *resource.Service
	runtimeInputs *runtimeinput.Service
	keys          *auth.Cache
	rates         *keyBuckets
	// streams bounds the open log follow streams.
	streams *streamGate
	// shutdown is closed when Serve begins to shut down: open log streams end.
	shutdown     chan struct{}
	shutdownOnce sync.Once
}

// New builds the API over cfg.
func New(cfg Config) *Server {
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = DefaultBodyLimit
	}
	if cfg.Catalog == nil {
		cfg.Catalog = catalog.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s := &Server{
		cfg:      cfg,
		log:      cfg.Logger,
		echo:     echo.New(),
		metrics:  newMetrics(reg),
		registry: reg,
		owners: &ownership.Manager{DB: cfg.DB, TombstoneRetention: cfg.TombstoneRetention, BusyWait: cfg.OwnershipBusyWait,
			LeaseTTL: cfg.OwnershipLeaseTTL, Holder: holder(cfg.Holder)},
		reservations: &reservation.Service{Catalog: cfg.Catalog},
		keys:         &auth.Cache{TTL: cfg.KeyCacheTTL},
		rates:        newKeyBuckets(cfg.Catalog.Rates),
		shutdown:     make(chan struct{}),
		streams:      newStreamGate(cfg.LogStreamsPerKey, cfg.LogStreamsPerOrganization),
	}
	backends := &backend.Registry{Wrap: cfg.WrapBackend, EdgeClient: cfg.CloudflareEdge}
	if cfg.DB != nil {
		b := ratebudget.New(cfg.DB)
		if o := cfg.CloudflareBudget; o.Capacity > 0 && o.PerSecond > 0 {
			b.Capacity, b.PerSecond = o.Capacity, o.PerSecond
		}
		if cfg.CloudflareBudget.Share > 0 {
			b.Share = cfg.CloudflareBudget.Share
		}
		backends.Budget = b
	}
	s.runtimeInputs = &runtimeinput.Service{Quotas: cfg.Catalog.Quotas, Ring: cfg.SealingRing, Backends: backends, Reservations: s.reservations}
	s.resources = &resource.Service{Catalog: cfg.Catalog, Backends: backends, Reservations: s.reservations,
		RuntimeInputs: s.runtimeInputs, Hooks: cfg.RuntimeInputHooks}
	s.owners.Recover = s.resources.Recover
	e := s.echo
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = s.handleError
	e.Use(withRequestID, s.observe, middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true, DisablePrintStack: true}))
	s.routes()
	return s
}

// routes is the one route table of the API.
func (s *Server) routes() {
	e := s.echo
	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)
	e.GET("/metrics", echo.WrapHandler(promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{})))

	// Every route names the scope it needs: reads, and the non-mutating derivation, need only
	// resources:read. Every request of a key spends from its rate (limitRate).
	v1 := e.Group("/v1", s.authenticate, s.limitRate)
	read, write := requireScope(auth.ScopeRead), requireScope(auth.ScopeWrite)
	v1.GET("/capabilities", s.capabilities, read)
	v1.GET("/offerings", s.offerings, read)
	v1.GET("/worker-endpoint-origin-reservations/:reservationId", s.getReservation, read)
	v1.PUT("/worker-endpoint-origin-reservations/:reservationId", s.putReservation, write)
	v1.DELETE("/worker-endpoint-origin-reservations/:reservationId", s.deleteReservation, write)
	v1.GET("/worker-endpoint-origin-reservations/:reservationId/activation", s.getActivation, read)
	v1.PUT("/worker-endpoint-origin-reservations/:reservationId/activation", s.putActivation, write)
	v1.DELETE("/worker-endpoint-origin-reservations/:reservationId/activation", s.deleteActivation, write)
	v1.POST("/worker-endpoint-origin-derivations", s.derive, read)
	v1.GET("/spaces/:space/workers/:name", s.getWorker, read)
	v1.GET("/workers/:uid", s.getWorkerByUID, read)
	v1.PUT("/spaces/:space/workers/:name", s.putWorker, write)
	v1.DELETE("/spaces/:space/workers/:name", s.deleteWorker, write)
	v1.GET("/spaces/:space/workers/:name/logs", s.getWorkerLogs, read)
	v1.GET("/spaces/:space/worker-endpoints/:name", s.getEndpoint, read)
	v1.PUT("/spaces/:space/worker-endpoints/:name", s.putEndpoint, write)
	v1.DELETE("/spaces/:space/worker-endpoints/:name", s.deleteEndpoint, write)
	v1.GET("/deletion-attestations/:uid", s.getAttestation, read)
	v1.GET("/operations/:id", s.getOperation, read)
	v1.GET("/organizations/:organizationId/worker-runtime-input-preparations/:operationId", s.getPreparation, read)
	v1.PUT("/organizations/:organizationId/worker-runtime-input-preparations/:operationId", s.putPreparation, write)
	v1.DELETE("/organizations/:organizationId/worker-runtime-input-preparations/:operationId", s.deletePreparation, write)
	v1.GET("/worker-runtime-input-references/:reference", s.getPreparationByReference, read)
	v1.POST("/runtime-input-commitment-keys", s.commitmentKey, write)
}

// holder names this process in lease rows.
func holder(name string) string {
	if name != "" {
		return name
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

// Routes lists the route table as "METHOD path" pairs, paths in echo's :param form.
func (s *Server) Routes() []string {
	var out []string
	for _, r := range s.echo.Routes() {
		if r.Method == echo.RouteNotFound {
			continue // the group's catch-all, so that unknown /v1 paths authenticate first
		}
		out = append(out, r.Method+" "+r.Path)
	}
	return out
}

// Handler is the API as an http.Handler.
func (s *Server) Handler() http.Handler { return s.echo }

// Serve answers on l until ctx ends, then shuts down gracefully.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(l) }()
	every := s.cfg.JanitorEvery
	if every <= 0 {
		every = time.Minute
	}
	go s.janitor(ctx, every)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.Shutdown()
	shutdown, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return fmt.Errorf("shut down HTTP server: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown ends the open log streams (Serve calls it as it shuts down; a caller serving Handler
// itself calls it before closing its server).
func (s *Server) Shutdown() { s.shutdownOnce.Do(func() { close(s.shutdown) }) }

// janitor does the Host's periodic housekeeping until ctx ends. Every step is a database
// statement or a compare-and-swap, so any number of replicas may run it at once:
//   - it recovers the operations of leases a stopped Host left to expire (a later request on the
//     same object would too);
//   - it takes down what creates that never committed left open on a backend;
//   - it reads again, once a late upload could have landed, the scripts whose apply a backend
//     without fences was read back not to hold, and takes down those that landed late;
//   - it releases, under the four fences, the Host-minted reservations of deleted workers;
//   - it expires runtime inputs past their window, dropping their sealed material;
//   - it reclaims expired tombstones, which every lookup already ignores.
func (s *Server) janitor(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.Sweep(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Sweep runs the janitor's steps once.
func (s *Server) Sweep(ctx context.Context) {
	warn := func(what string, err error) {
		if err != nil && ctx.Err() == nil {
			s.log.Warn(what, "error", err.Error())
		}
	}
	if n, err := s.owners.RecoverExpired(ctx); err != nil {
		warn("recover operations of expired leases", err)
	} else if n > 0 {
		s.log.Info("recovered operations left by a stopped Host", "count", n)
	}
	if n, err := s.resources.CollectOrphans(ctx, s.cfg.DB); err != nil {
		warn("collect orphaned deployments", err)
	} else if n > 0 {
		s.log.Info("took down deployments of creates that never committed", "count", n)
	}
	late, err := s.resources.RecheckLateWrites(ctx, s.cfg.DB)
	warn("re-check scripts a late upload may have landed on", err)
	for _, lw := range late {
		attrs := []any{"installation", lw.Installation, "script", lw.ScriptName, "worker_uid", lw.WorkerUID.String(), "deployment", lw.Deployment.String(), "status", lw.Status}
		if lw.Status == "removed" {
			s.log.Warn("took down a script that landed after its apply was decided lost (late upload)", append(attrs, "held_deployment", lw.Held.String())...)
		} else {
			s.log.Info("re-checked a script a late upload may have landed on", attrs...)
		}
	}
	if n, err := s.reservations.ReleaseGone(ctx, s.cfg.DB); err != nil {
		warn("release Host-minted reservations of deleted workers", err)
	} else if n > 0 {
		s.log.Info("released Host-minted reservations of deleted workers", "count", n)
	}
	if n, err := s.reservations.ExpireLapsed(ctx, s.cfg.DB); err != nil {
		warn("expire lapsed reservations", err)
	} else if n > 0 {
		s.log.Info("expired reservations whose TTL passed", "count", n)
	}
	if _, err := s.resources.SettleAttestations(ctx, s.cfg.DB); err != nil {
		warn("close deletion attestations whose route propagation ended", err)
	}
	if n, err := s.runtimeInputs.SweepExpired(ctx, s.cfg.DB); err != nil {
		warn("expire runtime inputs", err)
	} else if n > 0 {
		s.log.Info("expired runtime inputs and dropped their sealed material", "count", n)
	}
	if n, err := s.owners.PurgeTombstones(ctx); err != nil {
		warn("purge tombstones", err)
	} else if n > 0 {
		s.log.Info("purged expired tombstones", "count", n)
	}
}
