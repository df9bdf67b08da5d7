package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/server"
)

func TestMain(m *testing.M) { testdb.Main(m) }

type harness struct {
	t       *testing.T
	db      *pgxpool.Pool
	url     string
	logs    *runtimetest.Buffer
	org     auth.Organization
	key     string // read and write
	ring    *sealing.Ring
	runtime *runtimetest.Harness
	kek     sealing.KEK
	dbURL   string
	srv     *server.Server
	host    *host.Host
	// responses records every response the Host sent, headers and body, for canary searches.
	responses *runtimetest.Buffer
}

// edgePort is the port of the harness's runtime edge, which every selfhost origin carries.
func (h *harness) edgePort() string {
	_, port, err := net.SplitHostPort(h.runtime.Info.EdgeAddr)
	require.NoError(h.t, err)
	return port
}

// loadCatalog writes body as a catalog file and loads it, pointing its selfhost installations at
// the harness's runtime node unless they name one.
func loadCatalog(t *testing.T, body string, rt runtime.Info) *catalog.Catalog {
	t.Helper()
	var f map[string]any
	require.NoError(t, json.Unmarshal([]byte(body), &f))
	insts, _ := f["installations"].([]any)
	for _, i := range insts {
		inst := i.(map[string]any)
		if inst["pack"] != "selfhost" {
			continue
		}
		if _, ok := inst["runtimeUrl"]; !ok {
			inst["runtimeUrl"], inst["runtimeTokenFile"] = rt.AdminURL, rt.TokenFile
		}
		if _, ok := inst["edgeListen"]; !ok {
			inst["edgeListen"] = rt.EdgeAddr
		}
	}
	raw, err := json.Marshal(f)
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "catalog.json")
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	c, err := catalog.Load(path)
	require.NoError(t, err)
	return c
}

type options struct {
	// catalogJSON is a catalog file's body; its selfhost installations are pointed at the
	// harness's runtime node unless they name one.
	catalogJSON string
	busyWait    time.Duration
	keyCacheTTL time.Duration
	hooks       runtimeinput.Hooks
	wrap        func(backend.Mutator) backend.Mutator
	// cloudflareEdge reaches a Cloudflare stand-in's edge (the wfp-managed Ready probe).
	cloudflareEdge *http.Client
	// runtime adjusts the runtime node's configuration.
	runtime func(*runtime.Config)
	// roundTrips, when set, counts the Host's database round trips.
	roundTrips *testdb.RoundTrips
	// tracer, when set, watches the Host's database statements (in place of roundTrips).
	tracer pgx.QueryTracer
	// runtimeAdmin, when set, stands between the Host and the runtime node's admin API: it gets
	// the node's admin URL and returns the one the default catalog names instead.
	runtimeAdmin func(adminURL string) string
	// logStreams and logStreamAge bound log follow streams (the server's defaults when zero).
	logStreamsPerKey, logStreamsPerOrg int
	logStreamAge                       time.Duration
	// cfBudget overrides the Cloudflare API budget (defaults where zero).
	cfBudget ratebudget.Budget
	// dnsResolver is where custom domains' records are looked up (a dnstest server).
	dnsResolver string
}

func setup(t *testing.T, opts ...func(*options)) *harness {
	t.Helper()
	o := options{keyCacheTTL: -1} // every request asks the database, unless a test says otherwise
	for _, f := range opts {
		f(&o)
	}
	dbURL := testdb.URL(t)
	poolConfig, err := pgxpool.ParseConfig(dbURL)
	require.NoError(t, err)
	if o.roundTrips != nil {
		poolConfig.ConnConfig.Tracer = o.roundTrips
	}
	if o.tracer != nil {
		poolConfig.ConnConfig.Tracer = o.tracer
	}
	db, err := pgxpool.NewWithConfig(context.Background(), poolConfig)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	logs := &runtimetest.Buffer{}
	var mutate []func(*runtime.Config)
	if o.runtime != nil {
		mutate = append(mutate, o.runtime)
	}
	node := runtimetest.Start(t, mutate...)
	adminURL := node.Info.AdminURL
	if o.runtimeAdmin != nil {
		adminURL = o.runtimeAdmin(adminURL)
	}
	cat := catalog.DefaultWithRuntime(adminURL, node.Info.TokenFile, node.Info.EdgeAddr)
	// The per-key request rate is off unless a test's catalog sets one: the concurrency tests send
	// one key's requests as fast as they can, which a production rate limit rightly refuses.
	cat.Rates = catalog.Rates{}
	if o.catalogJSON != "" {
		cat = loadCatalog(t, o.catalogJSON, node.Info)
	}
	kekFile := filepath.Join(t.TempDir(), "sealing-key")
	_, err = sealing.WriteKEKFile(kekFile)
	require.NoError(t, err)
	kek, err := sealing.LoadKEK(kekFile)
	require.NoError(t, err)
	ring, err := sealing.OpenRing(context.Background(), db, kek)
	require.NoError(t, err)
	hst := host.New(host.Config{
		DB:                db,
		Catalog:           cat,
		Logger:            slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		OwnershipBusyWait: o.busyWait,
		SealingRing:       ring,
		RuntimeInputHooks: o.hooks,
		WrapBackend:       o.wrap,
		CloudflareEdge:    o.cloudflareEdge,
		CloudflareBudget:  o.cfBudget,
		DNSResolver:       &customdomain.Resolver{Server: o.dnsResolver, Timeout: time.Second},
	})
	srv := server.New(server.Config{
		Host:                      hst,
		KeyCacheTTL:               o.keyCacheTTL,
		LogStreamsPerKey:          o.logStreamsPerKey,
		LogStreamsPerOrganization: o.logStreamsPerOrg,
		LogStreamMaxAge:           o.logStreamAge,
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	h := &harness{t: t, db: db, url: ts.URL, logs: logs, ring: ring, kek: kek, dbURL: dbURL, responses: &runtimetest.Buffer{}, srv: srv, host: hst, runtime: node}
	t.Cleanup(func() {
		if t.Failed() {
			for _, line := range strings.Split(logs.String(), "\n") {
				if strings.Contains(line, `"level":"ERROR"`) {
					t.Log(line)
				}
			}
		}
	})
	h.org, h.key = h.newOrg("acme")
	return h
}

// advance moves the database's notion of time forward by interval (a PostgreSQL interval such as
// "2 minutes"), for every Host process on the database at once: TTLs and leases expire without a
// sleep.
func (h *harness) advance(interval string) {
	h.t.Helper()
	h.exec(`INSERT INTO clock_skew (skew) VALUES ($1::interval) ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`, interval)
}

func (h *harness) newOrg(name string) (auth.Organization, string) {
	h.t.Helper()
	ctx := context.Background()
	org, err := auth.CreateOrganization(ctx, h.db, name)
	require.NoError(h.t, err)
	key, err := auth.CreateKey(ctx, h.db, name, nil)
	require.NoError(h.t, err)
	return org, key.Key
}

func (h *harness) keyWith(org string, scopes ...string) auth.CreatedKey {
	h.t.Helper()
	key, err := auth.CreateKey(context.Background(), h.db, org, scopes)
	require.NoError(h.t, err)
	return key
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	var out map[string]any
	require.NoError(t, json.Unmarshal(r.body, &out), "body: %s", r.body)
	return out
}

// problem checks r is an RFC 9457 problem with code and returns it.
func (r reply) problem(t *testing.T, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, server.ProblemContentType, r.header.Get("Content-Type"))
	p := r.json(t)
	require.Equal(t, code, p["code"])
	require.Equal(t, "urn:takoform:problem:"+code, p["type"])
	require.EqualValues(t, status, p["status"])
	require.NotEmpty(t, p["title"])
	require.NotEmpty(t, p["detail"])
	require.Equal(t, r.header.Get("X-Request-Id"), p["requestId"])
	return p
}

type req struct {
	method, path, key, token, contentType string
	body                                  any
	headers                               map[string]string
}

func (h *harness) do(r req) reply {
	h.t.Helper()
	rep, err := h.try(r)
	require.NoError(h.t, err)
	return rep
}

// try sends one request and reports a transport error instead of failing the test, so that it
// may run on any goroutine (require may only be called from the test's own).
func (h *harness) try(r req) (reply, error) {
	var body io.Reader
	switch b := r.body.(type) {
	case nil:
	case string:
		body = strings.NewReader(b)
	case []byte:
		body = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			return reply{}, err
		}
		body = bytes.NewReader(raw)
	}
	hr, err := http.NewRequest(r.method, h.url+r.path, body)
	if err != nil {
		return reply{}, err
	}
	if r.key != "" {
		hr.Header.Set("Authorization", "Bearer "+r.key)
	}
	if r.token != "" {
		hr.Header.Set("Takoform-Ownership-Token", r.token)
	}
	if body != nil {
		ct := r.contentType
		if ct == "" {
			ct = "application/json"
		}
		hr.Header.Set("Content-Type", ct)
	}
	for k, v := range r.headers {
		hr.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		return reply{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return reply{}, err
	}
	_ = resp.Header.Write(h.responses)
	_, _ = h.responses.Write(raw)
	return reply{status: resp.StatusCode, header: resp.Header, body: raw}, nil
}

const resPath = "/v1/worker-endpoint-origin-reservations/"

func (h *harness) putReservation(key, id, token string, body any) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodPut, path: resPath + id, key: key, token: token, body: body})
}

func (h *harness) deleteReservation(key, id, token string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodDelete, path: resPath + id, key: key, token: token})
}

func (h *harness) getReservation(key, id string) reply {
	h.t.Helper()
	return h.do(req{method: http.MethodGet, path: resPath + id, key: key})
}

// rowCount counts stored reservation rows (any status) for the harness's database.
func (h *harness) rowCount(where string, args ...any) int {
	h.t.Helper()
	var n int
	require.NoError(h.t, h.db.QueryRow(context.Background(), "SELECT count(*) FROM worker_endpoint_origin_reservations WHERE "+where, args...).Scan(&n))
	return n
}

func apiBody(space, worker string) map[string]any {
	return map[string]any{"space": space, "workerName": worker}
}

// pollUntil polls cond on the test goroutine (so that cond may use the harness's require-based
// helpers) until it holds, failing the test with what after timeout.
func pollUntil(t *testing.T, timeout time.Duration, cond func() bool, what string, args ...any) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never true after %s: "+what, append([]any{timeout}, args...)...)
		}
	}
}
