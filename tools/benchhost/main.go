// Command benchhost measures the Host's request path (make bench): reservation PUTs against a Host
// on real PostgreSQL at 16 concurrent clients, new and replayed, next to the same
// insert-and-update transaction run straight on the same database, and new PUTs at 64 clients,
// printed as ratios with p50 and p99 latencies and the CPU each request cost the database and this
// process (the Host and its clients). Each of -runs runs starts its own throwaway PostgreSQL
// cluster, fills it with -fill reservations, workers and operations of other organizations
// (generate_series, not the API) and an in-process Host on a loopback listener, and removes both
// when done; the summary compares the runs, since a request path whose cost depends on the plan a
// pooled connection happened to cache shows up as runs that differ. The straight transactions and
// the new PUTs at 16 clients alternate in -slices slices, so that both are measured on the machine
// as it is at the time. It is a benchmark, not a test: run it on a quiet machine and read the
// figures, not a pass or fail.
//
// TAKOFORM_BENCH_ASYNC_COMMIT=1 compares the work per request without the disk. Diagnostics of the
// first run (each measures the two kinds one after the other, not in slices):
// TAKOFORM_BENCH_STATEMENTS=1 prints where PostgreSQL spent its time (pg_stat_statements: time,
// planning, blocks and WAL per call); TAKOFORM_BENCH_WAITS=1 samples the backends' wait events;
// TAKOFORM_BENCH_PERF=FILE records `perf record -a -g` into FILE.straight and FILE.new;
// TAKOFORM_BENCH_SLOW_MS=N keeps each run's cluster log with every statement slower than N ms,
// lock waits, checkpoints and autovacuum runs, to tell what a tail latency waited on.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/server"
)

func main() {
	duration := flag.Duration("duration", 4*time.Second, "how long each measurement runs")
	runs := flag.Int("runs", 10, "fresh clusters to measure, one after another")
	fillRows := flag.Int("fill", 100_000, "reservations, workers and operations of other organizations each run starts with")
	flag.IntVar(&pairSlices, "slices", 8, "straight SQL and new PUTs at 16 clients alternate in this many slices of each measurement (1: one after the other)")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of this process (the Host and its clients) during the first run's new PUTs at 16 clients to this file")
	flag.Parse()
	fmt.Printf("reservation PUT against one Host on PostgreSQL: %d fresh clusters, each filled with %d reservations, workers and operations of other organizations; %s per measurement, %d cores\n\n",
		*runs, *fillRows, *duration, numCPU())
	fmt.Printf("%-4s %7s %9s %13s %7s %7s %9s %9s %13s %8s %8s %8s %9s\n", "run", "sql/s", "sql p99", "sql cpu/req", "new/s", "new/sql",
		"new p50", "new p99", "new cpu/req", "replay/s", "rep/new", "64 new/s", "64 failed")
	fmt.Printf("%-4s %7s %9s %13s %7s %7s %9s %9s %13s\n", "", "", "", "(db+host µs)", "", "", "", "", "(db+host µs)")
	var all []runResult
	for i := range *runs {
		r, err := run(i+1, *duration, *fillRows)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchhost:", err)
			os.Exit(1)
		}
		all = append(all, r)
		sqlDB, sqlHost := r.sql.perOp()
		newDB, newHost := r.fresh.perOp()
		fmt.Printf("%-4d %7.0f %9s %13s %7.0f %6.2fx %9s %9s %13s %8.0f %7.2fx %8.0f %9d\n", i+1, r.sql.rate(), r.sql.pct(0.99).Round(10*time.Microsecond),
			fmt.Sprintf("%d+%d", sqlDB.Microseconds(), sqlHost.Microseconds()), r.fresh.rate(), r.fresh.rate()/r.sql.rate(),
			r.fresh.pct(0.5).Round(10*time.Microsecond), r.fresh.pct(0.99).Round(10*time.Microsecond), fmt.Sprintf("%d+%d", newDB.Microseconds(), newHost.Microseconds()),
			r.replay.rate(), r.replay.rate()/r.fresh.rate(), r.wide.rate(), r.wide.failures+r.fresh.failures+r.replay.failures+r.sql.failures)
	}
	summarize(all)
}

// runResult is one fresh cluster's measurements: 16 clients straight SQL, new and replayed PUTs,
// and new PUTs at 64 clients.
type runResult struct {
	sql, fresh, replay, wide result
}

// summarize prints the targets against every run.
func summarize(all []runResult) {
	if len(all) == 0 {
		return
	}
	lo, hi := all[0].fresh.rate(), all[0].fresh.rate()
	worstRatio, worstReplay, worstP99, failures := 1e9, 1e9, time.Duration(0), 0
	for _, r := range all {
		lo, hi = min(lo, r.fresh.rate()), max(hi, r.fresh.rate())
		worstRatio = min(worstRatio, r.fresh.rate()/r.sql.rate())
		worstReplay = min(worstReplay, r.replay.rate()/r.fresh.rate())
		worstP99 = max(worstP99, r.fresh.pct(0.99))
		failures += r.wide.failures + r.fresh.failures + r.replay.failures + r.sql.failures
	}
	check := func(ok bool) string {
		if ok {
			return "met"
		}
		return "MISSED"
	}
	fmt.Printf("\nnew PUT at 16 clients: slowest run %.0f/s, fastest %.0f/s (slowest is %.0f%% below the fastest; target within 20%%: %s)\n", lo, hi, 100*(1-lo/hi), check(lo >= 0.8*hi))
	fmt.Printf("every run's new PUT >= 0.5x straight SQL: worst %.2fx (%s)\n", worstRatio, check(worstRatio >= 0.5))
	fmt.Printf("p99 of new PUT < 50ms: worst %s (%s)\n", worstP99.Round(10*time.Microsecond), check(worstP99 < 50*time.Millisecond))
	fmt.Printf("replay >= 1.5x new: worst %.2fx (%s)\n", worstReplay, check(worstReplay >= 1.5))
	fmt.Printf("failed requests (64 clients included): %d (%s)\n", failures, check(failures == 0))
}

// result is one measurement.
type result struct {
	cpu      cpuUse // CPU the database and this process used during the measurement
	ops      int
	failures int
	elapsed  time.Duration
	lat      []time.Duration
}

// add is both measurements' requests, time and CPU, as if one.
func (r result) add(o result) result {
	return result{
		cpu:      cpuUse{db: r.cpu.db + o.cpu.db, self: r.cpu.self + o.cpu.self},
		ops:      r.ops + o.ops,
		failures: r.failures + o.failures,
		elapsed:  r.elapsed + o.elapsed,
		lat:      append(r.lat, o.lat...),
	}
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

// perOp is the CPU the database and this process (the Host and its clients) used per request.
func (r result) perOp() (db, host time.Duration) {
	if r.ops == 0 {
		return 0, 0
	}
	return r.cpu.db / time.Duration(r.ops), r.cpu.self / time.Duration(r.ops)
}

func (r result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

// measure runs op from clients goroutines for d; op gets the client index and its sequence number.
func measure(clients int, d time.Duration, op func(client, i int) error) result {
	before := cpuNow()
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := result{}
	var failures atomic.Int64
	stop := time.Now().Add(d)
	start := time.Now()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lat []time.Duration
			for i := 0; time.Now().Before(stop); i++ {
				t0 := time.Now()
				if err := op(c, i); err != nil {
					failures.Add(1)
					continue
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			res.lat = append(res.lat, lat...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed, res.ops, res.failures = time.Since(start), len(res.lat), int(failures.Load())
	res.cpu = cpuNow().since(before)
	return res
}

func run(n int, d time.Duration, fillRows int) (runResult, error) {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "takoform-bench-")
	if err != nil {
		return runResult{}, err
	}
	if os.Getenv("TAKOFORM_BENCH_SLOW_MS") == "" {
		defer os.RemoveAll(root)
	} else {
		fmt.Printf("run %d keeps its cluster's log: %s\n", n, filepath.Join(root, "pg", "postgres.log"))
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return runResult{}, err
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		return runResult{}, err
	}
	cluster, err := pgcluster.Open(ctx, filepath.Join(root, "pg"), pgcluster.Options{Port: port, Settings: benchSettings()})
	if err != nil {
		return runResult{}, err
	}
	if err := cluster.Start(ctx, "takoform"); err != nil {
		return runResult{}, err
	}
	defer func() { _ = cluster.Stop(context.Background()) }()
	if b, err := os.ReadFile(filepath.Join(cluster.Dir, "data", "postmaster.pid")); err == nil {
		clusterPID, _ = strconv.Atoi(strings.SplitN(string(b), "\n", 2)[0])
	}
	dbURL := cluster.URL("takoform")
	if err := store.MigrateUp(dbURL); err != nil {
		return runResult{}, err
	}
	db, err := store.Open(ctx, dbURL) // the Host's own pool, as takoserver serve opens it
	if err != nil {
		return runResult{}, err
	}
	defer db.Close()

	kekFile := filepath.Join(root, "sealing-key")
	if _, err := sealing.WriteKEKFile(kekFile); err != nil {
		return runResult{}, err
	}
	kek, err := sealing.LoadKEK(kekFile)
	if err != nil {
		return runResult{}, err
	}
	ring, err := sealing.OpenRing(ctx, db, kek)
	if err != nil {
		return runResult{}, err
	}
	if err := fill(ctx, db, fillRows); err != nil {
		return runResult{}, err
	}
	org, err := auth.CreateOrganization(ctx, db, "bench")
	if err != nil {
		return runResult{}, err
	}
	// The benchmark creates far more than the default ceiling of live reservations: an operator's
	// override lifts it, and the quota step still locks and counts as in production.
	lifted := quota.MaxCeiling
	if err := quota.Set(ctx, db, org.ID, quota.Reservations, &lifted); err != nil {
		return runResult{}, err
	}
	// The straight transaction's rows belong to an organization of their own.
	sqlOrg, err := auth.CreateOrganization(ctx, db, "bench-sql")
	if err != nil {
		return runResult{}, err
	}
	key, err := auth.CreateKey(ctx, db, "bench", nil)
	if err != nil {
		return runResult{}, err
	}
	// The per-key request rate (50/s by default) is turned off: this measures the request path,
	// not the limiter in front of it.
	cat := catalog.Default()
	cat.Rates = catalog.Rates{}
	srv := server.New(server.Config{Host: host.New(host.Config{DB: db, SealingRing: ring, Catalog: cat, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return runResult{}, err
	}
	hostCtx, stopHost := context.WithCancel(ctx)
	defer stopHost()
	go func() { _ = srv.Serve(hostCtx, l) }()
	base := "http://" + l.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128, MaxConnsPerHost: 128}}

	put := func(id, token string) error {
		body := fmt.Sprintf(`{"space":"prod","workerName":%q,"subdomain":%q}`, id, id)
		req, err := http.NewRequest(http.MethodPut, base+"/v1/worker-endpoint-origin-reservations/"+id, bytes.NewReader([]byte(body)))
		if err != nil {
			return err
		}
		req.Header.Set("Authorization", "Bearer "+key.Key)
		req.Header.Set("Takoform-Ownership-Token", token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}

	// The straight transaction: the same row insert (its uid time-ordered, as the Host makes it) and
	// binding upsert, nothing else.
	direct, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=64")
	if err != nil {
		return runResult{}, err
	}
	defer direct.Close()
	straight := func(id string) error {
		return pgx.BeginFunc(ctx, direct, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space,
				worker_name, subdomain, canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
				VALUES ($1, $2, $3, 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', $2, $2, 'http://' || $2 || '.sql.localhost',
				86400, 'prepared', now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost')`, sqlOrg.ID, id, uuid.Must(uuid.NewV7())); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
				VALUES ($1, 'bench', $2, 'token-bench-straight-0000', decode(repeat('00', 32), 'hex'), $3, 201, '{}')
				ON CONFLICT (organization_id, kind, external_key) DO UPDATE SET updated_at = now()`, sqlOrg.ID, id, uuid.New())
			return err
		})
	}

	statements := os.Getenv("TAKOFORM_BENCH_STATEMENTS") != "" && n == 1
	if statements {
		if _, err := db.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
			return runResult{}, err
		}
	}
	// Warm-up, not measured: each pool opens its connections, each connection prepares its
	// statements and compiles the functions it calls, as on a Host that has been serving for a while. Without it the first sixteen requests
	// of each measurement pay that once and are its p99.
	_ = measure(64, d/4, func(c, i int) error { return straight(fmt.Sprintf("warm-s-%d-%d", c, i)) })
	_ = measure(64, d/4, func(c, i int) error {
		id := fmt.Sprintf("warm-%d-%d", c, i)
		return put(id, "token-bench-"+id)
	})
	if statements {
		if _, err := db.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
			return runResult{}, err
		}
	}
	ids := make([][]string, 64)
	slice := 0 // ids differ from one slice to the next
	straightOp := func(c, i int) error { return straight(fmt.Sprintf("s-%d-%d-%d", slice, c, i)) }
	freshOp := func(c, i int) error {
		id := fmt.Sprintf("r-16-%d-%d-%d", slice, c, i)
		ids[c] = append(ids[c], id)
		return put(id, "token-bench-"+id)
	}
	var sql, fresh result
	diagnostics := n == 1 && (statements || cpuProfile != "" || os.Getenv("TAKOFORM_BENCH_PERF") != "" || os.Getenv("TAKOFORM_BENCH_WAITS") != "")
	if diagnostics || pairSlices <= 1 {
		// One measurement after the other, so that each diagnostic sees one kind of request.
		waits := startWaits(ctx, db, n)
		perfStop := perfRecord(n, "straight")
		sql = measure(16, d, straightOp)
		perfStop()
		waits()
		if statements {
			printStatements(ctx, db, "straight transactions at 16 clients", sql.ops)
		}
		if cpuProfile != "" && n == 1 {
			f, err := os.Create(cpuProfile)
			if err != nil {
				return runResult{}, err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return runResult{}, err
			}
		}
		if statements {
			if _, err := db.Exec(ctx, "SELECT pg_stat_statements_reset()"); err != nil {
				return runResult{}, err
			}
		}
		waits = startWaits(ctx, db, n)
		perfStop = perfRecord(n, "new")
		fresh = measure(16, d, freshOp)
		pprof.StopCPUProfile()
		perfStop()
		waits()
		if statements {
			printStatements(ctx, db, "new PUTs at 16 clients", fresh.ops)
		}
	} else {
		// Paired: the two alternate in short slices, so that a machine whose speed drifts over
		// seconds (other tenants of its host, its disk) slows both alike and their ratio holds.
		for k := range pairSlices {
			slice = k
			if k%2 == 0 {
				sql = sql.add(measure(16, d/time.Duration(pairSlices), straightOp))
				fresh = fresh.add(measure(16, d/time.Duration(pairSlices), freshOp))
			} else {
				fresh = fresh.add(measure(16, d/time.Duration(pairSlices), freshOp))
				sql = sql.add(measure(16, d/time.Duration(pairSlices), straightOp))
			}
		}
	}
	replay := measure(16, d, func(c, i int) error {
		if len(ids[c]) == 0 {
			return errors.New("nothing to replay")
		}
		id := ids[c][i%len(ids[c])]
		return put(id, "token-bench-"+id)
	})
	wide := measure(64, d, func(c, i int) error {
		id := fmt.Sprintf("r-64-%d-%d", c, i)
		return put(id, "token-bench-"+id)
	})
	return runResult{sql: sql, fresh: fresh, replay: replay, wide: wide}, nil
}

// cpuProfile is the -cpuprofile file.
var cpuProfile string

// pairSlices is the -slices flag.
var pairSlices int

func numCPU() int {
	n := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = bytes.Count(b, []byte("processor\t:"))
	}
	return n
}

// fill gives a fresh database what a Host with many tenants holds: n reservations (most released,
// some live), n workers (half deleted) and n operations, spread over n/100 organizations.
func fill(ctx context.Context, db *pgxpool.Pool, n int) error {
	for _, q := range []string{
		`INSERT INTO organizations (id, name) SELECT 'org_f' || lpad(i::text, 8, '0'), 'fill' || i FROM generate_series(1, greatest($1 / 100, 1)) i`,
		`INSERT INTO operations (id, organization_id, kind, external_key, method, status, started_at, finished_at)
		 SELECT md5('op' || i)::uuid, 'org_f' || lpad((1 + i % greatest($1 / 100, 1))::text, 8, '0'), 'worker', 'prod/w' || i, 'PUT',
		        'committed', now(), now()
		 FROM generate_series(1, $1) i`,
		`INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date, script_name,
		 offering_id, offering_digest, pack, installation, status, operation_id)
		 SELECT md5('w' || i)::uuid, o.organization_id, 'prod', 'w' || i, '{}', 'index.js', '2025-01-01', 'tsw-' || md5('w' || i),
		        'o', 'd', 'selfhost', 'selfhost', (CASE WHEN i % 2 = 0 THEN 'live' ELSE 'deleted' END)::resource_status, o.id
		 FROM generate_series(1, $1) i JOIN operations o ON o.id = md5('op' || i)::uuid`,
		`INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space, worker_name, subdomain,
		 canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
		 SELECT 'org_f' || lpad((1 + i % greatest($1 / 100, 1))::text, 8, '0'), 'res-' || i, md5('r' || i)::uuid,
		        'takoserver.worker-endpoint-origin-reservation.v2', 'prod', 'w' || i, 'w' || i, 'http://w' || i || '.fill.localhost',
		        86400, (CASE WHEN i % 4 = 0 THEN 'prepared' ELSE 'released' END)::reservation_status, now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost'
		 FROM generate_series(1, $1) i`,
		`ANALYZE`,
	} {
		if _, err := db.Exec(ctx, q, n); err != nil {
			if q == "ANALYZE" {
				_, err = db.Exec(ctx, q)
			}
			if err != nil {
				return fmt.Errorf("fill: %w", err)
			}
		}
	}
	return nil
}

// benchSettings are the cluster's server settings: durable commits, as in production, unless
// TAKOFORM_BENCH_ASYNC_COMMIT is set to compare the work per request without the disk.
func benchSettings() map[string]string {
	s := map[string]string{"max_connections": "300"}
	if v := os.Getenv("TAKOFORM_BENCH_SLOW_MS"); v != "" {
		s["log_min_duration_statement"] = v
		s["log_lock_waits"] = "on"
		s["deadlock_timeout"] = "20ms"
		s["log_checkpoints"] = "on"
		s["log_autovacuum_min_duration"] = "0"
	}
	if os.Getenv("TAKOFORM_BENCH_ASYNC_COMMIT") != "" {
		s["synchronous_commit"] = "off"
	}
	if os.Getenv("TAKOFORM_BENCH_STATEMENTS") != "" {
		s["shared_preload_libraries"] = "pg_stat_statements"
		s["pg_stat_statements.track"] = "all"
		s["pg_stat_statements.track_planning"] = "on"
	}
	return s
}

// perfRecord runs `perf record -a -g` over the whole machine into $TAKOFORM_BENCH_PERF.what during
// the first run's measurement named what, until the returned function is called. It does nothing
// unless that variable is set.
func perfRecord(run int, what string) func() {
	out := os.Getenv("TAKOFORM_BENCH_PERF")
	if out == "" || run != 1 {
		return func() {}
	}
	cmd := exec.Command("perf", "record", "-a", "-g", "-F", "499", "-o", out+"."+what)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Println("perf:", err)
		return func() {}
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
}

// startWaits samples what the cluster's other backends are doing every 10 ms, until the returned
// function is called, which prints the share of samples per state and wait event. It does nothing
// but in the first run, with TAKOFORM_BENCH_WAITS set (the sampling costs the cluster CPU of its own).
func startWaits(ctx context.Context, db *pgxpool.Pool, run int) func() {
	if os.Getenv("TAKOFORM_BENCH_WAITS") == "" || run != 1 {
		return func() {}
	}
	counts := map[string]int{}
	total := 0
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			rows, err := db.Query(ctx, `SELECT coalesce(state, '') || ' ' || coalesce(wait_event_type || ':' || wait_event, 'cpu')
				FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()`)
			if err != nil {
				return
			}
			for rows.Next() {
				var k string
				if rows.Scan(&k) == nil {
					counts[k]++
					total++
				}
			}
			rows.Close()
		}
	}()
	return func() {
		close(done)
		<-finished
		type kv struct {
			k string
			n int
		}
		var all []kv
		for k, n := range counts {
			all = append(all, kv{k, n})
		}
		sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n })
		fmt.Printf("\nbackends' states, sampled every 10 ms (%d samples):\n", total)
		for i, e := range all {
			if i == 12 {
				break
			}
			fmt.Printf("%7.1f%%  %s\n", 100*float64(e.n)/float64(max(total, 1)), e.k)
		}
	}
}

// printStatements prints where PostgreSQL spent its time during one measurement (what), per
// statement and per request.
func printStatements(ctx context.Context, db *pgxpool.Pool, what string, requests int) {
	rows, err := db.Query(ctx, `SELECT calls, round(total_exec_time::numeric, 1), round((total_exec_time / calls)::numeric * 1000, 1),
		round((total_plan_time / calls)::numeric * 1000, 1), plans,
		(shared_blks_hit + shared_blks_read)::float8 / calls, wal_bytes::float8 / calls,
		left(regexp_replace(query, '\s+', ' ', 'g'), 80)
		FROM pg_stat_statements WHERE query NOT LIKE '%pg_stat_statements%' ORDER BY total_exec_time DESC LIMIT 25`)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer rows.Close()
	fmt.Printf("\n%s: %d requests\n%8s %8s %10s %8s %8s %8s %8s %8s  %s\n", what, requests, "calls", "per req", "total ms", "avg µs", "plan µs", "plans", "blks/call", "wal B/call", "statement")
	for rows.Next() {
		var calls int64
		var total, avg, plan, blocks, wal float64
		var plans int64
		var q string
		if err := rows.Scan(&calls, &total, &avg, &plan, &plans, &blocks, &wal, &q); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%8d %8.2f %10.1f %8.1f %8.1f %8d %9.1f %10.0f  %s\n", calls, float64(calls)/float64(max(requests, 1)), total, avg, plan, plans, blocks, wal, q)
	}
}

// cpuUse is CPU time used by the database cluster (the postmaster and every backend, live or
// reaped) and by this process.
type cpuUse struct{ db, self time.Duration }

func (c cpuUse) since(before cpuUse) cpuUse {
	return cpuUse{db: c.db - before.db, self: c.self - before.self}
}

// clusterPID is the running cluster's postmaster, read from its postmaster.pid.
var clusterPID int

// cpuNow reads /proc: this process's own CPU, and the postmaster's with its children's (the
// reaped ones through its cutime and cstime, the live ones one by one).
func cpuNow() cpuUse {
	var u cpuUse
	u.self = procCPU(os.Getpid(), false)
	if clusterPID == 0 {
		return u
	}
	u.db = procCPU(clusterPID, true)
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 1 && f[1] == strconv.Itoa(clusterPID) {
			u.db += procCPU(pid, false)
		}
	}
	return u
}

// procStat is /proc/PID/stat's fields after the command name: state, ppid, and so on.
func procStat(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

// procCPU is a process's user and system time, with its reaped children's when asked.
func procCPU(pid int, children bool) time.Duration {
	f := procStat(pid)
	if len(f) < 15 {
		return 0
	}
	ticks := 0
	fields := []int{11, 12} // utime, stime
	if children {
		fields = append(fields, 13, 14) // cutime, cstime
	}
	for _, i := range fields {
		n, _ := strconv.Atoi(f[i])
		ticks += n
	}
	return time.Duration(ticks) * time.Second / 100 // USER_HZ
}
