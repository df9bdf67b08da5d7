// Package testhost starts a real Host for tests outside the server package (the provider's
// acceptance tests, the randomized invariant test): a fresh migrated database, a sealing key ring
// wrapped by a fresh key-encryption key, and the API on a loopback listener.
package testhost

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/server"
)

// Host is one running Host, the runtime node its selfhost installation drives, and an
// organization with a read-write key on it.
type Host struct {
	URL          string
	Runtime      *runtimetest.Harness
	DB           *pgxpool.Pool
	DatabaseURL  string
	Organization auth.Organization
	Key          string
	Server       *server.Server
	logs         *runtimetest.Buffer
}

// Options change what Start builds.
type Options struct {
	// CatalogFor, when set, builds the catalog from the runtime node Start runs (a catalog that
	// sells other installations beside it).
	CatalogFor func(node *runtimetest.Harness) *catalog.Catalog
	// CloudflareEdge, when set, is how the Host reaches Cloudflare's edge (a stand-in's).
	CloudflareEdge *http.Client
	// Organization names the organization Start creates ("acme" when empty).
	Organization string
	// Runtime, when set, adjusts the runtime node's config (for example its edge's HTTPS); the
	// default catalog then carries the edge's scheme.
	Runtime func(*runtime.Config)
	// DNSResolver is where custom domains' TXT records are looked up (a dnstest server's
	// address); the Host's checker then runs as Serve runs it.
	DNSResolver string
}

// Start starts a Host for t on a fresh database. The caller's package must run testdb.Main from
// TestMain. It fails t when anything is missing.
func Start(t testing.TB, opts Options) *Host {
	t.Helper()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	db, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("testhost: connect: %v", err)
	}
	t.Cleanup(db.Close)
	kekFile := filepath.Join(t.TempDir(), "sealing-key")
	if _, err := sealing.WriteKEKFile(kekFile); err != nil {
		t.Fatalf("testhost: sealing key: %v", err)
	}
	kek, err := sealing.LoadKEK(kekFile)
	if err != nil {
		t.Fatalf("testhost: sealing key: %v", err)
	}
	ring, err := sealing.OpenRing(ctx, db, kek)
	if err != nil {
		t.Fatalf("testhost: key ring: %v", err)
	}
	var mutate []func(*runtime.Config)
	if opts.Runtime != nil {
		mutate = append(mutate, opts.Runtime)
	}
	node := runtimetest.Start(t, mutate...)
	var cat *catalog.Catalog
	if opts.CatalogFor != nil {
		cat = opts.CatalogFor(node)
	} else {
		cat = catalog.DefaultWithEdge(node.Info.AdminURL, node.Info.TokenFile, node.Info.EdgeAddr, node.Info.EdgeScheme)
	}
	logs := &runtimetest.Buffer{}
	hst := host.New(host.Config{
		DB: db, Catalog: cat, SealingRing: ring, CloudflareEdge: opts.CloudflareEdge,
		DNSResolver: &customdomain.Resolver{Server: opts.DNSResolver, Timeout: time.Second},
		Logger:      slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	srv := server.New(server.Config{Host: hst})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	// Cron ticks are claimed as Serve claims them (tests bring a tick by moving the database's
	// clock); the janitor is left to the tests that sweep.
	crons, stopCrons := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); hst.Crons(crons, 200*time.Millisecond) }()
	t.Cleanup(func() { stopCrons(); <-done })
	if opts.DNSResolver != "" {
		checks, stopChecks := context.WithCancel(context.Background())
		checked := make(chan struct{})
		go func() { defer close(checked); hst.DomainChecks(checks, 200*time.Millisecond) }()
		t.Cleanup(func() { stopChecks(); <-checked })
	}
	name := opts.Organization
	if name == "" {
		name = "acme"
	}
	org, err := auth.CreateOrganization(ctx, db, name)
	if err != nil {
		t.Fatalf("testhost: organization: %v", err)
	}
	key, err := auth.CreateKey(ctx, db, name, nil)
	if err != nil {
		t.Fatalf("testhost: key: %v", err)
	}
	return &Host{URL: ts.URL, Runtime: node, DB: db, DatabaseURL: dbURL, Organization: org, Key: key.Key, Server: srv, logs: logs}
}

// NewKey issues another key of organization name (created when it does not exist) with scopes
// (all when none).
func (h *Host) NewKey(t testing.TB, name string, scopes ...string) string {
	t.Helper()
	ctx := context.Background()
	if _, err := auth.OrganizationByName(ctx, h.DB, name); err != nil {
		if _, err := auth.CreateOrganization(ctx, h.DB, name); err != nil {
			t.Fatalf("testhost: organization: %v", err)
		}
	}
	key, err := auth.CreateKey(ctx, h.DB, name, scopes)
	if err != nil {
		t.Fatalf("testhost: key: %v", err)
	}
	return key.Key
}

// Logs is everything the Host logged, at debug level.
func (h *Host) Logs() string { return h.logs.String() }

// EdgePort is the port of the runtime node's edge, which every origin of the default catalog
// carries.
func (h *Host) EdgePort() string {
	_, port, err := net.SplitHostPort(h.Runtime.Info.EdgeAddr)
	if err != nil {
		panic(err)
	}
	return port
}
