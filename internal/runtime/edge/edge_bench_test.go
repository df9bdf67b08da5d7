package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
)

func TestHostname(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"Hello.Workers.Localhost:8787": "hello.workers.localhost",
		"hello.workers.localhost.":     "hello.workers.localhost",
		"hello.workers.localhost":      "hello.workers.localhost",
		"[::1]:8787":                   "::1",
	} {
		require.Equal(t, want, edge.Hostname(in), in)
	}
}

const benchHost = "bench.workers.localhost"

type bench struct {
	h      *runtimetest.Harness
	c      *selfhost.Client
	ctx    context.Context
	client *http.Client
	gen    int64
}

func setupBench(b *testing.B) *bench {
	h := runtimetest.Start(b)
	c, err := selfhost.New(h.Info.AdminURL, h.Info.TokenFile)
	require.NoError(b, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	b.Cleanup(cancel)
	x := &bench{h: h, c: c, ctx: ctx, client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}}
	x.deploy(b)
	_, err = c.PutRoute(ctx, benchHost, adminapi.RoutePut{EffectID: "route", ScriptName: "bench", EndpointUID: "ep", DeploymentID: "d"})
	require.NoError(b, err)
	return x
}

// deploy PUTs the next generation and waits until it serves.
func (x *bench) deploy(b *testing.B) adminapi.ScriptStatus {
	x.gen++
	gen := x.gen
	_, err := x.c.PutScript(x.ctx, "bench", adminapi.ScriptPut{
		EffectID: fmt.Sprintf("deploy-%d", gen), WorkerUID: "uid-bench", DeploymentID: fmt.Sprintf("d%d", gen), Generation: gen,
		Modules:    map[string]string{"main.js": fmt.Sprintf(`export default { fetch() { return new Response("generation %d\n"); } };`, gen)},
		MainModule: "main.js", CompatibilityDate: "2024-09-23",
	})
	require.NoError(b, err)
	var st adminapi.ScriptStatus
	require.Eventually(b, func() bool {
		st, err = x.c.GetScript(x.ctx, "bench")
		require.NoError(b, err)
		return st.Ready && st.Incarnation.Generation == gen
	}, time.Minute, 10*time.Millisecond)
	return st
}

// load sends requests from workers goroutines for d and counts answers that are 200 and the
// rest.
func (x *bench) load(url, host string, workers int, d time.Duration) (ok, failed int64) {
	var okN, failedN atomic.Int64
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest(http.MethodGet, url, nil)
				if host != "" {
					req.Host = host
				}
				resp, err := x.client.Do(req)
				if err != nil {
					failedN.Add(1)
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					okN.Add(1)
				} else {
					failedN.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return okN.Load(), failedN.Load()
}

func window() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("TAKOFORM_BENCH_WINDOW")); err == nil && d > 0 {
		return d
	}
	return 3 * time.Second
}

// BenchmarkEdgeVersusDirect measures, in one run, requests per second to one worker (sandbox on)
// straight to its incarnation's workerd socket, through the edge, and through nginx in front of
// the same socket when nginx is on PATH (one worker process, upstream keep-alive; skipped with a
// message otherwise), and reports the ratios (target: edge ≥ 0.8× direct, and above nginx).
// Each run measures every path in turn, TAKOFORM_BENCH_ROUNDS times (default 2), for windows of
// TAKOFORM_BENCH_WINDOW (default 3s), with TAKOFORM_BENCH_CONCURRENCY keep-alive connections
// (default 16). The load generator (package loadgen below: hand-written HTTP/1.1 on raw
// connections, no allocation per request) runs in this process on the same cores, so it is kept
// as cheap as possible: what it spends is taken from every path alike.
func BenchmarkEdgeVersusDirect(b *testing.B) {
	x := setupBench(b)
	st, err := x.c.GetScript(x.ctx, "bench")
	require.NoError(b, err)
	status, err := x.c.Status(x.ctx)
	require.NoError(b, err)
	paths := []struct{ name, addr string }{{"direct", st.Incarnation.Address}, {"edge", x.h.Info.EdgeAddr}}
	if addr, why := startNginx(b, st.Incarnation.Address); addr != "" {
		paths = append(paths, struct{ name, addr string }{"nginx", addr})
	} else {
		b.Logf("nginx left out: %s", why)
	}
	workers := 16
	if n, err := strconv.Atoi(os.Getenv("TAKOFORM_BENCH_CONCURRENCY")); err == nil && n > 0 {
		workers = n
	}
	rounds := 2
	if n, err := strconv.Atoi(os.Getenv("TAKOFORM_BENCH_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	for b.Loop() {
		for _, p := range paths {
			_, _ = hammer(p.addr, benchHost, workers, 300*time.Millisecond) // warm every path's connections
		}
		rate, cpu, count := map[string]float64{}, map[string]time.Duration{}, map[string]int64{}
		d := window()
		for range rounds {
			for _, p := range paths {
				before := processCPU()
				n, err := hammer(p.addr, benchHost, workers, d)
				cpu[p.name] += processCPU() - before
				count[p.name] += n
				require.NoError(b, err, p.name)
				rate[p.name] += float64(n) / d.Seconds() / float64(rounds)
			}
		}
		// This process runs the load generator on every path and the edge on one: the difference
		// per request is what the edge costs, whatever else the machine runs meanwhile.
		perRequest := func(name string) float64 { return float64(cpu[name].Microseconds()) / float64(count[name]) }
		edgeCPU := perRequest("edge") - perRequest("direct")
		b.ReportMetric(edgeCPU, "edge-cpu-µs/req")
		line := fmt.Sprintf("%d connections, sandbox %s: direct %.0f req/s, edge %.0f req/s (%.2fx direct; the edge's own CPU %.1f µs/request, the load generator's %.1f)",
			workers, status.Sandbox, rate["direct"], rate["edge"], rate["edge"]/rate["direct"], edgeCPU, perRequest("direct"))
		b.ReportMetric(rate["direct"], "direct-req/s")
		b.ReportMetric(rate["edge"], "edge-req/s")
		b.ReportMetric(rate["edge"]/rate["direct"], "edge/direct")
		if n, ok := rate["nginx"]; ok {
			b.ReportMetric(n, "nginx-req/s")
			b.ReportMetric(n/rate["direct"], "nginx/direct")
			b.ReportMetric(rate["edge"]/n, "edge/nginx")
			line += fmt.Sprintf(", nginx %.0f req/s (%.2fx direct): edge/nginx %.2f", n, n/rate["direct"], rate["edge"]/n)
		}
		b.Log(line)
	}
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// hammer keeps workers keep-alive connections to addr busy with GET / for host during d, and
// returns how many 200 answers came back; anything else is an error.
func hammer(addr, host string, workers int, d time.Duration) (int64, error) {
	var total atomic.Int64
	errs := make(chan error, workers)
	deadline := time.Now().Add(d)
	req := []byte("GET / HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: takoform-bench\r\n\r\n")
	for range workers {
		go func() {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			br := bufio.NewReaderSize(c, 16<<10)
			var n int64
			for time.Now().Before(deadline) {
				if _, err := c.Write(req); err != nil {
					errs <- err
					return
				}
				if err := readAnswer(br); err != nil {
					errs <- err
					return
				}
				n++
			}
			total.Add(n)
			errs <- nil
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return total.Load(), first
}

// readAnswer reads one response, which must be a 200 with a length or chunked body.
func readAnswer(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 12 || string(line[9:12]) != "200" {
		return fmt.Errorf("answer %q", line)
	}
	length, chunked := int64(-1), false
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			if length, err = strconv.ParseInt(string(value), 10, 64); err != nil {
				return err
			}
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			chunked = bytes.EqualFold(value, []byte("chunked"))
		}
	}
	switch {
	case length >= 0:
		_, err = br.Discard(int(length))
		return err
	case !chunked:
		return errors.New("an answer without a length")
	}
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return err
		}
		size, err := strconv.ParseInt(string(bytes.TrimSpace(line)), 16, 64)
		if err != nil {
			return err
		}
		if size == 0 {
			_, err = br.ReadSlice('\n') // no trailers
			return err
		}
		if _, err := br.Discard(int(size) + 2); err != nil {
			return err
		}
	}
}

// startNginx runs nginx (one worker process, upstream keep-alive, no access log) in front of
// upstream and returns its address, or "" and why not.
func startNginx(b *testing.B, upstream string) (addr, why string) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return "", "not installed (apt install nginx to compare)"
	}
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	addr = l.Addr().String()
	l.Close()
	user := ""
	if os.Geteuid() == 0 {
		user = "user root;"
	}
	conf := fmt.Sprintf(`%s
worker_processes 1;
daemon off;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path %[2]s/body; proxy_temp_path %[2]s/proxy; fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi; scgi_temp_path %[2]s/scgi;
  upstream workerd { server %[3]s; keepalive 64; }
  server {
    listen %[4]s;
    location / {
      proxy_pass http://workerd;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
    }
  }
}
`, user, dir, upstream, addr)
	require.NoError(b, os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o600))
	cmd := exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "nginx.conf"))
	require.NoError(b, cmd.Start())
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGQUIT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, ""
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
	return "", "did not start: " + string(log)
}

// BenchmarkUpdateUnderLoad keeps a steady load on the edge while the worker is updated several
// times (candidate, Ready, switch, drain) and reports failed requests (target 0).
func BenchmarkUpdateUnderLoad(b *testing.B) {
	x := setupBench(b)
	viaEdge := "http://" + x.h.Info.EdgeAddr + "/"
	const updates = 5
	for b.Loop() {
		done := make(chan struct{})
		var ok, failed int64
		go func() {
			defer close(done)
			ok, failed = x.load(viaEdge, benchHost, 2, time.Duration(updates+1)*window()/2+2*time.Second)
		}()
		time.Sleep(500 * time.Millisecond)
		for range updates {
			x.deploy(b)
			time.Sleep(window() / 2)
		}
		<-done
		b.ReportMetric(float64(failed), "failed-requests")
		b.ReportMetric(float64(ok), "ok-requests")
		b.ReportMetric(updates, "updates")
		b.Logf("%d updates under load: %d requests answered, %d failed", updates, ok, failed)
	}
}
