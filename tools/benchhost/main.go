// Command benchhost measures the Host's request path (make bench): reservation PUTs against a Host
// on real PostgreSQL at 1, 16 and 64 concurrent clients, new and replayed, next to the same
// insert-and-update transaction run straight on the same database, printed as ratios with p50 and
// p99 latencies. It starts its own throwaway PostgreSQL cluster and an in-process Host on a
// loopback listener, and removes both when done. It is a benchmark, not a test: run it on a quiet
// machine and read the figures, not a pass or fail. TAKOFORM_BENCH_ASYNC_COMMIT=1 compares the
// work per request without the disk; TAKOFORM_BENCH_STATEMENTS=1 prints where PostgreSQL spent
// its time (pg_stat_statements).
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
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/pgcluster"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/server"
)

func main() {
	duration := flag.Duration("duration", 5*time.Second, "how long each measurement runs")
	flag.Parse()
	if err := run(*duration); err != nil {
		fmt.Fprintln(os.Stderr, "benchhost:", err)
		os.Exit(1)
	}
}

// result is one measurement.
type result struct {
	ops      int
	failures int
	elapsed  time.Duration
	lat      []time.Duration
}

func (r result) rate() float64 { return float64(r.ops) / r.elapsed.Seconds() }

func (r result) pct(p float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return r.lat[min(len(r.lat)-1, int(float64(len(r.lat))*p))]
}

// measure runs op from clients goroutines for d; op gets the client index and its sequence number.
func measure(clients int, d time.Duration, op func(client, i int) error) result {
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
	return res
}

func run(d time.Duration) error {
	ctx := context.Background()
	root, err := os.MkdirTemp("", "takoform-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	if err := os.Chmod(root, 0o755); err != nil {
		return err
	}
	port, err := pgcluster.FreePort()
	if err != nil {
		return err
	}
	cluster, err := pgcluster.Open(ctx, filepath.Join(root, "pg"), pgcluster.Options{Port: port, Settings: benchSettings()})
	if err != nil {
		return err
	}
	if err := cluster.Start(ctx, "takoform"); err != nil {
		return err
	}
	defer func() { _ = cluster.Stop(context.Background()) }()
	dbURL := cluster.URL("takoform")
	if err := store.MigrateUp(dbURL); err != nil {
		return err
	}
	db, err := store.Open(ctx, dbURL) // the Host's own pool, as takoserver serve opens it
	if err != nil {
		return err
	}
	defer db.Close()

	kekFile := filepath.Join(root, "sealing-key")
	if _, err := sealing.WriteKEKFile(kekFile); err != nil {
		return err
	}
	kek, err := sealing.LoadKEK(kekFile)
	if err != nil {
		return err
	}
	ring, err := sealing.OpenRing(ctx, db, kek)
	if err != nil {
		return err
	}
	org, err := auth.CreateOrganization(ctx, db, "bench")
	if err != nil {
		return err
	}
	key, err := auth.CreateKey(ctx, db, "bench", nil)
	if err != nil {
		return err
	}
	srv := server.New(server.Config{DB: db, SealingRing: ring, Logger: slog.New(slog.NewJSONHandler(io.Discard, nil))})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
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

	// The straight transaction: the same row insert and binding upsert, nothing else.
	direct, err := pgxpool.New(ctx, dbURL+"&pool_max_conns=64")
	if err != nil {
		return err
	}
	defer direct.Close()
	straight := func(id string) error {
		return pgx.BeginFunc(ctx, direct, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO worker_endpoint_origin_reservations (organization_id, id, uid, format, space,
				worker_name, subdomain, canonical_origin, ttl_seconds, status, expires_at, offering_id, offering_digest, pack, installation)
				VALUES ($1, $2, $3, 'takoserver.worker-endpoint-origin-reservation.v2', 'prod', $2, $2, 'http://' || $2 || '.sql.localhost',
				86400, 'prepared', now() + interval '1 day', 'o', 'd', 'selfhost', 'selfhost')`, org.ID, id, uuid.New()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
				VALUES ($1, 'bench', $2, 'token-bench-straight-0000', decode(repeat('00', 32), 'hex'), $3, 201, '{}')
				ON CONFLICT (organization_id, kind, external_key) DO UPDATE SET updated_at = now()`, org.ID, id, uuid.New())
			return err
		})
	}

	if os.Getenv("TAKOFORM_BENCH_STATEMENTS") != "" {
		if _, err := db.Exec(ctx, "CREATE EXTENSION pg_stat_statements"); err != nil {
			return err
		}
		defer func() {
			rows, err := db.Query(ctx, `SELECT calls, round(total_exec_time::numeric, 1), round((total_exec_time / calls)::numeric * 1000, 1), left(regexp_replace(query, '\s+', ' ', 'g'), 70)
				FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 25`)
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("\n%8s %10s %8s  %s\n", "calls", "total ms", "avg µs", "statement")
			for rows.Next() {
				var calls int64
				var total, avg float64
				var q string
				_ = rows.Scan(&calls, &total, &avg, &q)
				fmt.Printf("%8d %10.1f %8.1f  %s\n", calls, total, avg, q)
			}
		}()
	}
	fmt.Printf("reservation PUT against one Host on PostgreSQL, %s per measurement, %d cores\n\n", d, numCPU())
	fmt.Printf("%-8s %-10s %10s %10s %10s %8s %9s\n", "clients", "what", "req/s", "p50", "p99", "failed", "ratio")
	for _, clients := range benchClients() {
		sql := measure(clients, d, func(c, i int) error { return straight(fmt.Sprintf("s-%d-%d-%d", clients, c, i)) })
		ids := make([][]string, clients)
		fresh := measure(clients, d, func(c, i int) error {
			id := fmt.Sprintf("r-%d-%d-%d", clients, c, i)
			ids[c] = append(ids[c], id)
			return put(id, "token-bench-"+id)
		})
		replay := measure(clients, d, func(c, i int) error {
			if len(ids[c]) == 0 {
				return errors.New("nothing to replay")
			}
			id := ids[c][i%len(ids[c])]
			return put(id, "token-bench-"+id)
		})
		fmt.Printf("%-8d %-10s %10.0f %10s %10s %8d %9s\n", clients, "sql", sql.rate(), sql.pct(0.5).Round(10*time.Microsecond), sql.pct(0.99).Round(10*time.Microsecond), sql.failures, "1.00x")
		fmt.Printf("%-8d %-10s %10.0f %10s %10s %8d %8.2fx\n", clients, "new PUT", fresh.rate(), fresh.pct(0.5).Round(10*time.Microsecond), fresh.pct(0.99).Round(10*time.Microsecond), fresh.failures, fresh.rate()/sql.rate())
		fmt.Printf("%-8d %-10s %10.0f %10s %10s %8d %8.2fx (%.2fx new)\n", clients, "replay", replay.rate(), replay.pct(0.5).Round(10*time.Microsecond), replay.pct(0.99).Round(10*time.Microsecond), replay.failures, replay.rate()/sql.rate(), replay.rate()/fresh.rate())
	}
	return nil
}

func numCPU() int {
	n := 0
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		n = bytes.Count(b, []byte("processor\t:"))
	}
	return n
}

func benchClients() []int { return []int{1, 16, 64} }

// benchSettings are the cluster's server settings: durable commits, as in production, unless
// TAKOFORM_BENCH_ASYNC_COMMIT is set to compare the work per request without the disk.
func benchSettings() map[string]string {
	s := map[string]string{"max_connections": "300"}
	if os.Getenv("TAKOFORM_BENCH_ASYNC_COMMIT") != "" {
		s["synchronous_commit"] = "off"
	}
	if os.Getenv("TAKOFORM_BENCH_STATEMENTS") != "" {
		s["shared_preload_libraries"] = "pg_stat_statements"
		s["pg_stat_statements.track"] = "all"
	}
	return s
}
