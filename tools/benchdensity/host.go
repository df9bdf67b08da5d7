package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/server"
)

// viaHost creates workers through a Host: a worker and its endpoint (the Host mints its
// reservation) per worker, with the API key of the worker's organization. A PUT of a worker
// answers once the node admitted its deployment, so its rate is the rate users see.
type viaHost struct {
	db     *pgxpool.Pool
	base   string
	keys   []string
	client *http.Client
	hosts  []string
}

// startHost starts a throwaway PostgreSQL cluster under dir and a Host on it whose selfhost
// installation is the node of info, with orgs organizations and a key each, their ceilings lifted
// to hold n workers (and with statements, pg_stat_statements loaded). stop ends both.
func startHost(ctx context.Context, dir string, info runtime.Info, orgs, n int, statements bool) (_ *viaHost, stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	port, err := pgcluster.FreePort()
	if err != nil {
		return nil, stop, err
	}
	opts := pgcluster.Options{Port: port}
	if statements {
		opts.Settings = map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.track_planning": "on", "pg_stat_statements.track": "all"}
	}
	cluster, err := pgcluster.Open(ctx, filepath.Join(dir, "pg"), opts)
	if err != nil {
		return nil, stop, err
	}
	if err := cluster.Start(ctx, "takoform"); err != nil {
		return nil, stop, err
	}
	stops = append(stops, func() { _ = cluster.Stop(context.Background()) })
	dbURL := cluster.URL("takoform")
	if err := store.MigrateUp(dbURL); err != nil {
		return nil, stop, err
	}
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		return nil, stop, err
	}
	stops = append(stops, db.Close)
	if statements {
		if _, err := db.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
			return nil, stop, err
		}
	}
	kekFile := filepath.Join(dir, "host-sealing-key")
	if _, err := sealing.WriteKEKFile(kekFile); err != nil {
		return nil, stop, err
	}
	kek, err := sealing.LoadKEK(kekFile)
	if err != nil {
		return nil, stop, err
	}
	ring, err := sealing.OpenRing(ctx, db, kek)
	if err != nil {
		return nil, stop, err
	}
	cat := catalog.DefaultWithRuntime(info.AdminURL, info.TokenFile, info.EdgeAddr)
	cat.Rates = catalog.Rates{} // the request path, not the limiter in front of it
	// Ceilings well above what each organization will hold: within 32 of a ceiling the quota step
	// counts exactly and takes every slot (creates of one organization then wait for each other),
	// which is the path of an organization at its ceiling, not of a node filling up.
	per := 2*(n/orgs+1) + 64
	cat.Quotas = quota.Ceilings{Workers: per, Endpoints: per, Reservations: 2 * per, RuntimeInputs: per, CustomDomains: quota.DefaultCustomDomains}
	h := &viaHost{db: db, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}, hosts: make([]string, n)}
	for o := range orgs {
		name := fmt.Sprintf("org-%d", o)
		if _, err := auth.CreateOrganization(ctx, db, name); err != nil {
			return nil, stop, err
		}
		key, err := auth.CreateKey(ctx, db, name, nil)
		if err != nil {
			return nil, stop, err
		}
		h.keys = append(h.keys, key.Key)
	}
	srv := server.New(server.Config{Host: host.New(host.Config{DB: db, SealingRing: ring, Catalog: cat, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, stop, err
	}
	hostCtx, cancel := context.WithCancel(ctx)
	stops = append(stops, cancel)
	go func() { _ = srv.Serve(hostCtx, l) }()
	h.base = "http://" + l.Addr().String()
	return h, stop, nil
}

// create makes worker i and its endpoint, and keeps its hostname.
func (h *viaHost) create(ctx context.Context, i, orgs int) error {
	key := h.keys[i%orgs]
	name := fmt.Sprintf("w%05d", i)
	worker := map[string]any{
		"modules": map[string]string{"main.js": fmt.Sprintf(workerSource, i, i%orgs)}, "mainModule": "main.js",
		"compatibilityDate": "2024-09-23", "requiredSensitiveVars": []string{},
	}
	if _, err := h.put(ctx, key, "/v1/spaces/prod/workers/"+name, "token-worker-"+name+"-0001", worker); err != nil {
		return err
	}
	ep, err := h.put(ctx, key, "/v1/spaces/prod/worker-endpoints/"+name, "token-endpoint-"+name+"-01", map[string]any{"worker": name})
	if err != nil {
		return err
	}
	host, _ := ep["hostname"].(string)
	h.hosts[i] = host
	return nil
}

func (h *viaHost) put(ctx context.Context, key, path, token string, body any) (map[string]any, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, h.base+path, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Takoform-Ownership-Token", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("PUT %s answered %d: %s", path, resp.StatusCode, raw)
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, err
	}
	return out, nil
}

// reportStatements prints the n statements that took PostgreSQL the most time (planning and
// execution) since the cluster started, with their calls and the time per worker created.
func (h *viaHost) reportStatements(n int) {
	ctx := context.Background()
	rows, err := h.db.Query(ctx, `SELECT calls, total_plan_time + total_exec_time, left(regexp_replace(query, '\s+', ' ', 'g'), 110)
		FROM pg_stat_statements ORDER BY total_plan_time + total_exec_time DESC LIMIT $1`, n)
	if err != nil {
		fmt.Println("pg_stat_statements:", err)
		return
	}
	defer rows.Close()
	workers := len(h.hosts)
	fmt.Printf("PostgreSQL statements by time (ms per worker created, calls per worker):\n")
	for rows.Next() {
		var calls int64
		var ms float64
		var query string
		if err := rows.Scan(&calls, &ms, &query); err != nil {
			fmt.Println("pg_stat_statements:", err)
			return
		}
		fmt.Printf("  %6.3f ms %5.2f× %s\n", ms/float64(workers), float64(calls)/float64(workers), query)
	}
}
