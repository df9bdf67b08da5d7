// Command benchdensity measures how many workers one runtime node holds (make bench-density,
// SPEC 5.1 "Density"): it starts an in-process runtime node with its sandbox and cgroup ceilings
// on, creates N workers with an endpoint each (spread over a number of organizations, so over as
// many org processes and sandbox uids), and reports how many became Ready, how fast they were
// created, the machine's load meanwhile, and the proportional memory (PSS, from
// /proc/PID/smaps_rollup: workerd's pages are shared between its processes) of each idle worker
// all-in: every org process with its sandbox, and the runtime node itself. It is a benchmark, not
// a test: run it on a quiet machine and read the figures.
//
// Creation goes straight through the node's admin API, the way the Host's selfhost backend drives
// it, or with -host through a Host on a throwaway PostgreSQL cluster (a worker and its endpoint
// per worker, through the public API).
package main

import (
	"bufio"
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
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/proctree"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

func main() {
	n := flag.Int("n", 3000, "workers to create")
	orgs := flag.Int("orgs", 20, "organizations the workers belong to (one sandbox uid each)")
	clients := flag.Int("clients", 16, "concurrent creations")
	insecure := flag.Bool("insecure-no-sandbox", false, "measure without the sandbox, for comparison")
	settle := flag.Duration("settle", 3*time.Second, "idle time before memory is read")
	timeout := flag.Duration("timeout", 10*time.Minute, "how long all workers may take to become Ready")
	host := flag.Bool("host", false, "create the workers through a Host on a throwaway PostgreSQL cluster (a worker and its endpoint each), not the node's admin API")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of this process (the runtime node, and the Host with -host) to this file")
	statements := flag.Int("pg-statements", 0, "with -host: report the PostgreSQL statements that took the most time (pg_stat_statements), this many")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchdensity:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	if err := run(*n, *orgs, *clients, *insecure, *host, *statements, *settle, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "benchdensity:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

const workerSource = `export default {
  async fetch(req) { return new Response("worker %d of organization %d\n"); }
};`

func run(n, orgs, clients int, insecure, viaHostAPI bool, statements int, settle, timeout time.Duration) error {
	dir, err := os.MkdirTemp("", "benchdensity-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The PostgreSQL cluster of -host runs as its own user, which must reach its directory; the
	// node's state directory inside is 0700 either way.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	private := filepath.Join(dir, "node")
	if err := os.Mkdir(private, 0o700); err != nil {
		return err
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	edgeL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	node, err := runtime.Start(runtime.Config{
		StateDir: filepath.Join(private, "runtime"), AdminListener: admin, EdgeListener: edgeL,
		// The node's own sealing key, outside its state directory, made on this first start.
		SealingKeyFile: filepath.Join(private, "runtime-sealing-key"), CreateSealingKey: true,
		InsecureNoSandbox: insecure, ProbeDeadline: timeout,
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		return err
	}
	defer node.Close()
	info := node.Info()
	c, err := selfhost.New(info.AdminURL, info.TokenFile)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	st, err := c.Status(ctx)
	if err != nil {
		return err
	}
	how := "the node's admin API"
	create := func(ctx context.Context, i int) error { return createScript(ctx, c, i, orgs) }
	hostOf := hostname
	if viaHostAPI {
		h, stop, err := startHost(ctx, dir, info, orgs, n, statements > 0)
		if err != nil {
			return err
		}
		defer stop()
		if statements > 0 {
			defer h.reportStatements(statements)
		}
		how, create = "a Host (worker and endpoint PUTs)", func(ctx context.Context, i int) error { return h.create(ctx, i, orgs) }
		hostOf = func(i int) string { return h.hosts[i] }
	}
	fmt.Printf("runtime node: sandbox %s; %d workers over %d organizations, created through %s, %d concurrent creations\n", st.Sandbox, n, orgs, how, clients)

	// Create: a script and its route per worker, from clients goroutines.
	load := watchLoad()
	start := time.Now()
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr sync.Once
	var createErr error
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := create(ctx, i); err != nil {
					failed.Add(1)
					firstErr.Do(func() { createErr = err })
				}
			}
		}()
	}
	wg.Wait()
	accepted := time.Since(start)
	if createErr != nil {
		fmt.Printf("creation failures: %d (first: %v)\n", failed.Load(), createErr)
	}

	// Ready: poll the node's status until every script is Ready or the time is up.
	var ready int
	var readyAt time.Duration
	for {
		st, err := c.Status(ctx)
		if err != nil {
			return err
		}
		ready = 0
		for _, s := range st.Scripts {
			if s.Ready {
				ready++
			}
		}
		if ready == n || ctx.Err() != nil {
			readyAt = time.Since(start)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	fmt.Printf("created: %d requests accepted in %s; %d/%d Ready after %s: %.1f workers/s; load average at most %.1f meanwhile\n",
		2*n, accepted.Round(time.Millisecond), ready, n, readyAt.Round(time.Millisecond), float64(ready)/readyAt.Seconds(), load())

	// Every worker answers once at its hostname, then idles.
	answered := 0
	for i := range n {
		if get(info.EdgeAddr, hostOf(i)) == nil {
			answered++
		}
	}
	fmt.Printf("answered through the edge: %d/%d\n", answered, n)
	time.Sleep(settle)

	st, err = c.Status(ctx)
	if err != nil {
		return err
	}
	return reportMemory(st)
}

func scriptName(i int) string { return fmt.Sprintf("bench-%05d", i) }
func hostname(i int) string   { return fmt.Sprintf("w%05d.workers.localhost", i) }

func createScript(ctx context.Context, c *selfhost.Client, i, orgs int) error {
	org := i % orgs
	_, err := c.PutScript(ctx, scriptName(i), adminapi.ScriptPut{
		EffectID: fmt.Sprintf("bench-script-%d", i), WorkerUID: fmt.Sprintf("uid-%d", i),
		DeploymentID: fmt.Sprintf("dep-%d", i), Generation: 1,
		Labels:            adminapi.Labels{Organization: fmt.Sprintf("org-%d", org), Space: "prod", Worker: fmt.Sprintf("w%d", i)},
		Modules:           map[string]string{"main.js": fmt.Sprintf(workerSource, i, org)},
		MainModule:        "main.js",
		CompatibilityDate: "2024-09-23",
	})
	if err != nil {
		return err
	}
	_, err = c.PutRoute(ctx, hostname(i), adminapi.RoutePut{EffectID: fmt.Sprintf("bench-route-%d", i), ScriptName: scriptName(i),
		EndpointUID: fmt.Sprintf("ep-%d", i), DeploymentID: fmt.Sprintf("dep-%d", i)})
	return err
}

func get(edgeAddr, host string) error {
	req, err := http.NewRequest(http.MethodGet, "http://"+edgeAddr+"/", nil)
	if err != nil {
		return err
	}
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %d", host, resp.StatusCode)
	}
	return nil
}

// reportMemory sums PSS and RSS over every org process that holds a Ready worker (bwrap, the
// sandbox's init and workerd; workerd alone without the sandbox), and this process (the runtime
// node itself), and divides by the Ready workers: memory per worker all-in.
func reportMemory(st adminapi.Status) error {
	children, err := proctree.Read()
	if err != nil {
		return err
	}
	procs := map[int]bool{}
	workers := 0
	for _, s := range st.Scripts {
		if !s.Ready || s.Incarnation == nil || s.Incarnation.PID == 0 {
			continue
		}
		workers++
		procs[s.Incarnation.PID] = true
	}
	if workers == 0 {
		return errors.New("no Ready worker to measure")
	}
	var orgPss, orgRss []int64
	for pid := range procs {
		var p, r int64
		for _, d := range children.Descendants(pid) {
			pp, rr, err := rollup(d)
			if err == nil {
				p, r = p+pp, r+rr
			}
		}
		orgPss, orgRss = append(orgPss, p), append(orgRss, r)
	}
	self, _, err := rollup(os.Getpid())
	if err != nil {
		return err
	}
	total := sum(orgPss) + float64(self)
	fmt.Printf("idle memory: %d org processes (PSS mean %.0f MiB, median %.0f, RSS mean %.0f) and the runtime node (%.0f MiB): total PSS %.0f MiB, %.2f MiB per worker all-in over %d workers\n",
		len(orgPss), mb(mean(orgPss)), mb(median(orgPss)), mb(mean(orgRss)), mb(float64(self)), mb(total), mb(total/float64(workers)), workers)
	return nil
}

// watchLoad samples the one-minute load average every second until the returned function is
// called, which answers the highest seen.
func watchLoad() func() float64 {
	var mu sync.Mutex
	highest := 0.0
	done := make(chan struct{})
	go func() {
		for {
			if b, err := os.ReadFile("/proc/loadavg"); err == nil {
				if f := strings.Fields(string(b)); len(f) > 0 {
					if v, err := strconv.ParseFloat(f[0], 64); err == nil {
						mu.Lock()
						highest = max(highest, v)
						mu.Unlock()
					}
				}
			}
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	var once sync.Once
	return func() float64 {
		once.Do(func() { close(done) })
		mu.Lock()
		defer mu.Unlock()
		return highest
	}
}

// rollup reads Pss and Rss (kB) of one process.
func rollup(pid int) (pss, rss int64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "Pss:":
			pss = v
		case "Rss:":
			rss = v
		}
	}
	return pss, rss, nil
}

func mb(kb float64) float64 { return kb / 1024 }

func sum(v []int64) float64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return float64(s)
}

func mean(v []int64) float64 { return sum(v) / float64(len(v)) }

func median(v []int64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	return float64(s[len(s)/2])
}
