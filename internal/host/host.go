// Package host is the Host's composition root: it builds the domain (ownership, reservations,
// resources, runtime inputs, the backends and their Cloudflare budget) from one Config, and runs
// the janitor over it. The server package only puts HTTP in front of a Host.
package host

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/packs"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
)

// Config is what the domain of one Host process needs.
type Config struct {
	DB      *pgxpool.Pool
	Catalog *catalog.Catalog
	Logger  *slog.Logger
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
	// WrapBackend wraps every backend mutator (tests only: to hold or fail a backend call).
	WrapBackend func(backend.Mutator) backend.Mutator
	// CloudflareEdge reaches Cloudflare's edge for the wfp-managed Ready probe (default: a plain
	// client); tests and demos resolve worker hostnames to a stand-in's edge with it.
	CloudflareEdge *http.Client
	// DNSResolver looks custom domains' TXT records up (SPEC 3.7: serve --dns-resolver); the
	// first nameserver of /etc/resolv.conf when nil.
	DNSResolver *customdomain.Resolver
	// CloudflareBudget overrides the Cloudflare API budget's capacity, rate and organization share
	// (ratebudget's defaults where zero; tests make it small).
	CloudflareBudget ratebudget.Budget
}

// Host is one Host process's domain: the services every route and the janitor work through.
type Host struct {
	// Registry holds the process's metrics: the Host's own, and those its HTTP layer adds.
	Registry      *prometheus.Registry
	metrics       *metrics
	DB            *pgxpool.Pool
	Catalog       *catalog.Catalog
	Log           *slog.Logger
	Ring          *sealing.Ring
	Owners        *ownership.Manager
	Reservations  *reservation.Service
	Resources     *resource.Service
	RuntimeInputs *runtimeinput.Service
	Domains       *customdomain.Service
	backends      *backend.Registry
}

// New builds the domain over cfg. Without a database it builds what needs none (the route table
// can be listed, nothing served).
func New(cfg Config) *Host {
	if cfg.Catalog == nil {
		cfg.Catalog = catalog.Default()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	reg := newRegistry()
	h := &Host{Registry: reg, metrics: newMetrics(reg), DB: cfg.DB, Catalog: cfg.Catalog, Log: cfg.Logger, Ring: cfg.SealingRing,
		Owners: &ownership.Manager{DB: cfg.DB, TombstoneRetention: cfg.TombstoneRetention, BusyWait: cfg.OwnershipBusyWait,
			LeaseTTL: cfg.OwnershipLeaseTTL, Holder: holder(cfg.Holder)},
		Reservations: &reservation.Service{Catalog: cfg.Catalog},
	}
	if cfg.DB != nil {
		reg.MustRegister(newLeases(cfg.DB))
	}
	backends := &backend.Registry{Packs: packs.All(), Wrap: cfg.WrapBackend, EdgeClient: cfg.CloudflareEdge, Log: cfg.Logger, Seen: h.metrics.seen}
	if cfg.DB != nil {
		backends.Budget = budget(cfg.DB, cfg.CloudflareBudget)
		backends.Pools = nodepool.NewMembers(cfg.DB)
	}
	h.backends = backends
	h.RuntimeInputs = &runtimeinput.Service{Quotas: cfg.Catalog.Quotas, Ring: cfg.SealingRing, Backends: backends, Reservations: h.Reservations}
	h.Resources = &resource.Service{Catalog: cfg.Catalog, Backends: backends, Reservations: h.Reservations,
		RuntimeInputs: h.RuntimeInputs, Hooks: cfg.RuntimeInputHooks}
	h.Owners.Recover = h.Resources.Recover
	resolver := cfg.DNSResolver
	if resolver == nil {
		resolver = &customdomain.Resolver{}
	}
	h.Domains = &customdomain.Service{Catalog: cfg.Catalog, Ring: cfg.SealingRing, Resolver: resolver}
	return h
}

// budget is the installation-wide Cloudflare API budget, with the overrides o sets.
func budget(db *pgxpool.Pool, o ratebudget.Budget) *ratebudget.Budget {
	b := ratebudget.New(db)
	if o.Capacity > 0 && o.PerSecond > 0 {
		b.Capacity, b.PerSecond = o.Capacity, o.PerSecond
	}
	if o.Share > 0 {
		b.Share = o.Share
	}
	return b
}

// holder names this process in lease rows.
func holder(name string) string {
	if name != "" {
		return name
	}
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}
