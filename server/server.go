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
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// DefaultBodyLimit bounds every request body.
const DefaultBodyLimit = 1 << 20

// Config is what the HTTP layer of a Host process needs.
type Config struct {
	// Host is the domain the routes work through (host.New of an empty config when nil: the
	// route table can be listed, nothing served).
	Host *host.Host
	// Logger logs requests (the Host's logger when nil).
	Logger *slog.Logger
	// BodyLimit bounds request bodies in bytes (1 MiB when zero).
	BodyLimit int64
	// JanitorEvery is how often Serve runs the Host's janitor (a minute when zero).
	JanitorEvery time.Duration
	// CronEvery is how often Serve claims the cron ticks due (a second when zero).
	CronEvery time.Duration
	// DomainCheckEvery is how often Serve looks for custom domains due for a lookup (2 s when
	// zero; each claim has its own backoff).
	DomainCheckEvery time.Duration
	// KeyCacheTTL is how long a key that authenticated is trusted without asking the database
	// again: how soon a revocation reaches this replica (one second when zero; negative: never
	// cached).
	KeyCacheTTL time.Duration
	// LogStreamsPerKey and LogStreamsPerOrganization cap the log follow streams open at once on
	// this replica (DefaultLogStreamsPerKey and DefaultLogStreamsPerOrganization when zero), and
	// LogStreamMaxAge ends a follow stream that has lasted that long (DefaultLogStreamMaxAge when
	// zero): its client reconnects with since.
	LogStreamsPerKey          int
	LogStreamsPerOrganization int
	LogStreamMaxAge           time.Duration
}

// Server is one Host process's HTTP API.
type Server struct {
	cfg           Config
	host          *host.Host
	db            *pgxpool.Pool
	catalog       *catalog.Catalog
	log           *slog.Logger
	echo          *echo.Echo
	metrics       *metrics
	registry      *prometheus.Registry
	owners        *ownership.Manager
	reservations  *reservation.Service
	domains       *customdomain.Service
	resources     *resource.Service
	runtimeInputs *runtimeinput.Service
	keys          *auth.Cache
	rates         *keyBuckets
	// streams bounds the open log follow streams.
	streams *streamGate
	// workerBodyLimit bounds a worker PUT's body: 4/3 of the largest bundle ceiling of the
	// catalog's offerings, and 64 KiB beside (SPEC 3.6).
	workerBodyLimit int64
	// schemaNewer is set once the database is found migrated past this binary (checkSchema).
	schemaNewer atomic.Pointer[store.SchemaNewer]
	// schemaChecked is when checkSchema last read the version (Unix nanoseconds).
	schemaChecked atomic.Int64
	// shutdown is closed when Serve begins to shut down: open log streams end.
	shutdown     chan struct{}
	shutdownOnce sync.Once
}

// New builds the API over cfg's Host.
func New(cfg Config) *Server {
	if cfg.BodyLimit <= 0 {
		cfg.BodyLimit = DefaultBodyLimit
	}
	if cfg.Host == nil {
		cfg.Host = host.New(host.Config{})
	}
	if cfg.Logger == nil {
		cfg.Logger = cfg.Host.Log
	}
	h := cfg.Host
	reg := h.Registry
	s := &Server{
		cfg:           cfg,
		host:          h,
		db:            h.DB,
		catalog:       h.Catalog,
		log:           cfg.Logger,
		echo:          echo.New(),
		metrics:       newMetrics(reg),
		registry:      reg,
		owners:        h.Owners,
		reservations:  h.Reservations,
		domains:       h.Domains,
		resources:     h.Resources,
		runtimeInputs: h.RuntimeInputs,
		keys:          &auth.Cache{TTL: cfg.KeyCacheTTL},
		rates:         newKeyBuckets(h.Catalog.Rates),
		shutdown:      make(chan struct{}),
		streams:       newStreamGate(cfg.LogStreamsPerKey, cfg.LogStreamsPerOrganization),
	}
	s.workerBodyLimit = cfg.BodyLimit
	for _, o := range h.Catalog.Offerings {
		if o.Kind == catalog.KindWorker {
			// The source maps travel beside the bundle, outside its ceiling (SPEC 3.6).
			s.workerBodyLimit = max(s.workerBodyLimit, (o.BundleCeiling()+workerconf.MaxSourceMapsBytes)/3*4+64<<10)
		}
	}
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
	v1 := e.Group("/v1", s.refuseWhenSchemaNewer, s.authenticate, s.limitRate)
	read, write := requireScope(auth.ScopeRead), requireScope(auth.ScopeWrite)
	v1.GET("/capabilities", s.capabilities, read)
	v1.GET("/offerings", s.offerings, read)
	v1.GET("/custom-domains/:hostname", s.getCustomDomain, read)
	v1.PUT("/custom-domains/:hostname", s.putCustomDomain, write)
	v1.DELETE("/custom-domains/:hostname", s.deleteCustomDomain, write)
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
	go s.host.Janitor(ctx, every)
	cronEvery := s.cfg.CronEvery
	if cronEvery <= 0 {
		cronEvery = time.Second
	}
	go s.host.Crons(ctx, cronEvery)
	domainEvery := s.cfg.DomainCheckEvery
	if domainEvery <= 0 {
		domainEvery = 2 * time.Second
	}
	go s.host.DomainChecks(ctx, domainEvery)
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
