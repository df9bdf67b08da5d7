package edge_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
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

func setupBench(b *testing.B, mutate ...func(*runtime.Config)) *bench {
	h := runtimetest.Start(b, mutate...)
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
		got, err := x.c.GetScript(x.ctx, "bench")
		if err != nil {
			return false // a failed read is retried; the deadline reports it
		}
		st = got
		return st.Ready && st.Incarnation.Generation == gen
	}, time.Minute, 10*time.Millisecond, "generation %d never Ready", gen)
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

// benchPath is one way to the bench worker: straight to a workerd socket, through the edge or
// through nginx, over plain HTTP/1.1 or over TLS (HTTP/1.1 by ALPN).
type benchPath struct {
	name, addr string
	// header is sent with every request: the direct path names the incarnation, as the edge does.
	header   string
	tls      *tls.Config // nil: plain
	nginxPID int
	// workerdPID is the workerd (or the sandbox holding it) that answers this path.
	workerdPID int
}

// BenchmarkEdgeVersusDirect measures, in one run, requests per second to one worker (sandbox on)
// as a static worker on a workerd of its own (no router, no sandbox: what the router costs),
// straight to its organization process's ingress socket (naming the incarnation in the
// Takoform-Incarnation header, so the process's router is paid on every path), through the
// edge, and through nginx in front of the same socket when nginx is on PATH (one worker process, upstream keep-alive; skipped with a
// message otherwise), and reports the ratios (target: edge ≥ 0.8× direct, and above nginx). With
// TLS too: a second node whose edge serves HTTPS with a certificate the bench makes (its own CA),
// against nginx terminating TLS with the same certificate in front of that node's workerd
// socket; clients speak HTTP/1.1 on kept-alive TLS connections, so the figures are TLS's record
// cost per request, not its handshakes.
// Each run measures every path in turn, TAKOFORM_BENCH_ROUNDS times (default 2), for windows of
// TAKOFORM_BENCH_WINDOW (default 3s), with TAKOFORM_BENCH_CONCURRENCY keep-alive connections
// (default 16). The load generator (package loadgen below: hand-written HTTP/1.1 on raw
// connections, no allocation per request) runs in this process on the same cores, so it is kept
// as cheap as possible: what it spends is taken from every path alike.
func BenchmarkEdgeVersusDirect(b *testing.B) {
	x := setupBench(b)
	ca := testpki.NewCA(b, "bench")
	pair := ca.Server(b, "bench-edge", "*.workers.localhost")
	xt := setupBench(b, func(c *runtime.Config) { c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, pair.KeyFile })
	roots := x509.NewCertPool()
	caPEM, err := os.ReadFile(ca.CertFile)
	require.NoError(b, err)
	require.True(b, roots.AppendCertsFromPEM(caPEM))
	clientTLS := &tls.Config{RootCAs: roots, ServerName: benchHost, NextProtos: []string{"http/1.1"}}

	st, err := x.c.GetScript(x.ctx, "bench")
	require.NoError(b, err)
	stt, err := xt.c.GetScript(xt.ctx, "bench")
	require.NoError(b, err)
	status, err := x.c.Status(x.ctx)
	require.NoError(b, err)
	direct := edge.IncarnationHeader + ": " + st.Incarnation.Loader + "\r\n"
	org, orgTLS := st.Incarnation.PID, stt.Incarnation.PID
	staticAddr, staticPID := startStatic(b, fmt.Sprintf("generation %d\n", x.gen))
	paths := []benchPath{
		{name: "static", addr: staticAddr, workerdPID: staticPID},
		{name: "direct", addr: st.Incarnation.Address, header: direct, workerdPID: org},
		{name: "edge", addr: x.h.Info.EdgeAddr, workerdPID: org},
	}
	if addr, pid, why := startNginx(b, st.Incarnation.Address, st.Incarnation.Loader, nil); addr != "" {
		paths = append(paths, benchPath{name: "nginx", addr: addr, nginxPID: pid, workerdPID: org})
	} else {
		b.Logf("nginx left out: %s", why)
	}
	paths = append(paths, benchPath{name: "edge-tls", addr: xt.h.Info.EdgeAddr, tls: clientTLS, workerdPID: orgTLS})
	if addr, pid, why := startNginx(b, stt.Incarnation.Address, stt.Incarnation.Loader, &pair); addr != "" {
		paths = append(paths, benchPath{name: "nginx-tls", addr: addr, tls: clientTLS, nginxPID: pid, workerdPID: orgTLS})
	} else {
		b.Logf("nginx with TLS left out: %s", why)
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
			_, _, _ = hammer(p.addr, benchHost, p.header, p.tls, workers, 300*time.Millisecond) // warm every path's connections
		}
		rate, cpu, count, dropped := map[string]float64{}, map[string]time.Duration{}, map[string]int64{}, map[string]int64{}
		nginxCPU, workerdCPU := map[string]time.Duration{}, map[string]time.Duration{}
		reads, writes := map[string]int64{}, map[string]int64{}
		d := window()
		for range rounds {
			for _, p := range paths {
				before, nginxBefore, workerdBefore := processCPU(), treeCPU(p.nginxPID), workerdtest.SubtreeCPU(p.workerdPID)
				readsBefore, writesBefore := processSyscalls()
				stopProfile := profile(b, p.name)
				n, lost, err := hammer(p.addr, benchHost, p.header, p.tls, workers, d)
				stopProfile()
				readsAfter, writesAfter := processSyscalls()
				reads[p.name] += readsAfter - readsBefore
				writes[p.name] += writesAfter - writesBefore
				dropped[p.name] += lost
				cpu[p.name] += processCPU() - before
				nginxCPU[p.name] += treeCPU(p.nginxPID) - nginxBefore
				workerdCPU[p.name] += workerdtest.SubtreeCPU(p.workerdPID) - workerdBefore
				count[p.name] += n
				if err != nil {
					for _, h := range []*runtimetest.Harness{x.h, xt.h} {
						for _, l := range strings.Split(h.Logs.String(), "\n") {
							if !strings.Contains(l, `"level":"DEBUG"`) && !strings.Contains(l, "runtime node started") {
								b.Log(l)
							}
						}
					}
				}
				require.NoError(b, err, p.name)
				rate[p.name] += float64(n) / d.Seconds() / float64(rounds)
			}
		}
		// This process runs the load generator on every path and the edge on two: the difference
		// per request is what the edge costs, whatever else the machine runs meanwhile. Over TLS
		// the load generator's own TLS is what this process spends on nginx-tls.
		perRequest := func(name string) float64 { return float64(cpu[name].Microseconds()) / float64(count[name]) }
		edgeCPU := perRequest("edge") - perRequest("direct")
		b.ReportMetric(edgeCPU, "edge-cpu-µs/req")
		// System calls the same way (read and write family, counted by the kernel for this
		// process; the pool's liveness peek, a recvfrom, is not among them).
		perCall := func(m map[string]int64, name string) float64 { return float64(m[name]) / float64(count[name]) }
		edgeReads, edgeWrites := perCall(reads, "edge")-perCall(reads, "direct"), perCall(writes, "edge")-perCall(writes, "direct")
		b.ReportMetric(edgeReads, "edge-reads/req")
		b.ReportMetric(edgeWrites, "edge-writes/req")
		line := fmt.Sprintf("%d connections, sandbox %s: direct %.0f req/s, edge %.0f req/s (%.2fx direct; the edge's own CPU %.1f µs/request, the load generator's %.1f; the edge's reads %.1f and writes %.1f per request)",
			workers, status.Sandbox, rate["direct"], rate["edge"], rate["edge"]/rate["direct"], edgeCPU, perRequest("direct"), edgeReads, edgeWrites)
		b.ReportMetric(rate["direct"], "direct-req/s")
		b.ReportMetric(rate["edge"], "edge-req/s")
		b.ReportMetric(rate["edge"]/rate["direct"], "edge/direct")
		if n, ok := rate["nginx"]; ok {
			b.ReportMetric(n, "nginx-req/s")
			b.ReportMetric(n/rate["direct"], "nginx/direct")
			b.ReportMetric(rate["edge"]/n, "edge/nginx")
			perNginx := float64(nginxCPU["nginx"].Microseconds()) / float64(count["nginx"])
			b.ReportMetric(perNginx, "nginx-cpu-µs/req")
			line += fmt.Sprintf(", nginx %.0f req/s (%.2fx direct; its own CPU %.1f µs/request): edge/nginx %.2f", n, n/rate["direct"], perNginx, rate["edge"]/n)
		}
		b.Log(line)
		// workerd's CPU per request: the organization process (router, isolate, tail) against the
		// same code as a static worker on a workerd of its own, without router or sandbox.
		perWorkerd := func(name string) float64 { return float64(workerdCPU[name].Microseconds()) / float64(count[name]) }
		b.ReportMetric(rate["static"], "static-req/s")
		b.ReportMetric(perWorkerd("static"), "static-workerd-µs/req")
		b.ReportMetric(perWorkerd("direct"), "org-workerd-µs/req")
		b.Logf("the router's cost: a static worker on its own workerd %.0f req/s (workerd's CPU %.0f µs/request), the same code through the organization process's router %.0f req/s (%.2fx; workerd's CPU %.0f µs/request, %.1fx)",
			rate["static"], perWorkerd("static"), rate["direct"], rate["direct"]/rate["static"], perWorkerd("direct"), perWorkerd("direct")/perWorkerd("static"))
		line = fmt.Sprintf("over TLS (HTTP/1.1, kept-alive connections): edge %.0f req/s (%.2fx direct)", rate["edge-tls"], rate["edge-tls"]/rate["direct"])
		b.ReportMetric(rate["edge-tls"], "edge-tls-req/s")
		b.ReportMetric(rate["edge-tls"]/rate["direct"], "edge-tls/direct")
		if n, ok := rate["nginx-tls"]; ok {
			b.ReportMetric(n, "nginx-tls-req/s")
			b.ReportMetric(n/rate["direct"], "nginx-tls/direct")
			b.ReportMetric(rate["edge-tls"]/n, "edge-tls/nginx-tls")
			perNginx := float64(nginxCPU["nginx-tls"].Microseconds()) / float64(count["nginx-tls"])
			edgeTLSCPU := perRequest("edge-tls") - perRequest("nginx-tls")
			tlsReads := perCall(reads, "edge-tls") - perCall(reads, "nginx-tls")
			tlsWrites := perCall(writes, "edge-tls") - perCall(writes, "nginx-tls")
			b.ReportMetric(perNginx, "nginx-tls-cpu-µs/req")
			b.ReportMetric(edgeTLSCPU, "edge-tls-cpu-µs/req")
			b.ReportMetric(tlsReads, "edge-tls-reads/req")
			b.ReportMetric(tlsWrites, "edge-tls-writes/req")
			line += fmt.Sprintf(", the edge's own CPU %.1f µs/request (reads %.1f, writes %.1f); nginx %.0f req/s (%.2fx direct; its own CPU %.1f µs/request): edge/nginx %.2f",
				edgeTLSCPU, tlsReads, tlsWrites, n, n/rate["direct"], perNginx, rate["edge-tls"]/n)
		}
		b.Log(line)
		after, err := x.c.GetScript(x.ctx, "bench")
		require.NoError(b, err)
		afterTLS, err := xt.c.GetScript(xt.ctx, "bench")
		require.NoError(b, err)
		b.Logf("requests without an answer: direct %d, edge %d, nginx %d, edge-tls %d, nginx-tls %d; worker restarts during the run: %d and %d with TLS (liveness kills a process whose probe times out under this load)",
			dropped["direct"], dropped["edge"], dropped["nginx"], dropped["edge-tls"], dropped["nginx-tls"],
			after.Incarnation.Restarts-st.Incarnation.Restarts, afterTLS.Incarnation.Restarts-stt.Incarnation.Restarts)
	}
}

// profile writes a CPU profile of this process while the path named by TAKOFORM_BENCH_PROFILE
// (edge, direct) is measured, to the file TAKOFORM_BENCH_PROFILE_OUT (default edge-cpu.pprof).
func profile(b *testing.B, path string) (stop func()) {
	if os.Getenv("TAKOFORM_BENCH_PROFILE") != path {
		return func() {}
	}
	out := os.Getenv("TAKOFORM_BENCH_PROFILE_OUT")
	if out == "" {
		out = "edge-cpu.pprof"
	}
	f, err := os.Create(out)
	require.NoError(b, err)
	require.NoError(b, pprof.StartCPUProfile(f))
	return func() { pprof.StopCPUProfile(); f.Close() }
}

// processCPU is the CPU time (user and system) this process has used.
func processCPU() time.Duration {
	var u syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
	return time.Duration(u.Utime.Nano() + u.Stime.Nano())
}

// processSyscalls is how many read and write system calls this process has made (syscr and
// syscw of /proc/self/io), or zeros where the kernel does not say.
func processSyscalls() (reads, writes int64) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, value, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(value, 10, 64)
		switch name {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// treeCPU is the CPU time (user and system) process pid's children have used (nginx's workers).
func treeCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	var total time.Duration
	for _, child := range strings.Fields(string(children)) {
		stat, err := os.ReadFile("/proc/" + child + "/stat")
		if err != nil {
			continue
		}
		// Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 12 {
			utime, _ := strconv.ParseInt(fields[11], 10, 64)
			stime, _ := strconv.ParseInt(fields[12], 10, 64)
			total += time.Duration(utime+stime) * time.Second / workerdtest.ClockTicks
		}
	}
	return total
}

// startStatic runs body's worker as a static worker on a workerd of its own (the pinned one, the
// node's V8 flags, no sandbox, no router) listening on a loopback port, and returns its address
// and process.
func startStatic(b *testing.B, body string) (addr string, pid int) {
	bin := os.Getenv("TAKOFORM_WORKERD")
	if bin == "" {
		bin = "workerd"
	}
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	addr = l.Addr().String()
	l.Close()
	source := fmt.Sprintf("export default { fetch() { return new Response(%q); } };", body)
	require.NoError(b, os.WriteFile(filepath.Join(dir, "main.js"), []byte(source), 0o600))
	conf := fmt.Sprintf(`using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .w) ],
  sockets = [ (name = "http", address = %q, http = (), service = "main") ],
  v8Flags = %s,
);
const w :Workerd.Worker = (
  modules = [ (name = "main.js", esModule = embed "main.js") ],
  compatibilityDate = "2024-09-23",
);
`, addr, workerd.V8FlagsList(128))
	require.NoError(b, os.WriteFile(filepath.Join(dir, "config.capnp"), []byte(conf), 0o600))
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.capnp"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(b, cmd.Start())
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for start := time.Now(); time.Since(start) < 10*time.Second; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, cmd.Process.Pid
		}
	}
	b.Fatalf("the static workerd did not start: %s", out.String())
	return "", 0
}

// hammer keeps workers keep-alive connections to addr ("unix:" and a path, or host:port; over TLS
// with tlsConfig, when given) busy with GET / for host, with header (whole lines) added, during d, and returns how many 200 answers came back and how many requests
// got none (a connection closed or broken under them: the next request opens a new one). Any
// answer but a 200 is an error.
func hammer(addr, host, header string, tlsConfig *tls.Config, workers int, d time.Duration) (ok, dropped int64, err error) {
	var okN, droppedN atomic.Int64
	errs := make(chan error, workers)
	deadline := time.Now().Add(d)
	req := []byte("GET / HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: takoform-bench\r\n" + header + "\r\n")
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	for range workers {
		go func() {
			var c net.Conn
			var br *bufio.Reader
			defer func() {
				if c != nil {
					c.Close()
				}
			}()
			var n, lost int64
			defer func() { okN.Add(n); droppedN.Add(lost) }()
			for time.Now().Before(deadline) {
				if c == nil {
					var err error
					if tlsConfig != nil {
						c, err = tls.Dial(network, addr, tlsConfig)
					} else {
						c, err = net.Dial(network, addr)
					}
					if err != nil {
						errs <- err
						return
					}
					br = bufio.NewReaderSize(c, 16<<10)
				}
				_, err := c.Write(req)
				if err == nil {
					err = readAnswer(br)
				}
				var answer *badAnswer
				switch {
				case errors.As(err, &answer):
					errs <- err
					return
				case err != nil:
					lost++
					c.Close()
					c = nil
				default:
					n++
				}
			}
			errs <- nil
		}()
	}
	var first error
	for range workers {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return okN.Load(), droppedN.Load(), first
}

// badAnswer is an answer other than a 200.
type badAnswer struct{ line string }

func (b *badAnswer) Error() string { return fmt.Sprintf("answer %q", b.line) }

// readAnswer reads one response, which must be a 200 with a length or chunked body.
func readAnswer(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 12 || string(line[9:12]) != "200" {
		return &badAnswer{string(line)}
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
// upstream (a "unix:" socket path, naming loader in the Takoform-Incarnation header, as the edge
// does), terminating TLS with pair when given, and returns its address and its master's pid,
// or "" and why not.
func startNginx(b *testing.B, upstream, loader string, pair *testpki.Pair) (addr string, pid int, why string) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		return "", 0, "not installed (apt install nginx to compare)"
	}
	dir := b.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	addr = l.Addr().String()
	l.Close()
	ssl := ""
	if pair != nil {
		// TLS 1.2 and 1.3 with nginx's default ciphers: what the edge offers too.
		ssl = fmt.Sprintf(" ssl;\n    ssl_certificate %s;\n    ssl_certificate_key %s;\n    ssl_protocols TLSv1.2 TLSv1.3", pair.CertFile, pair.KeyFile)
	}
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
    listen %[4]s%[5]s;
    location / {
      proxy_pass http://workerd;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header Takoform-Incarnation %[6]s;
    }
  }
}
`, user, dir, upstream, addr, ssl, loader)
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
			return addr, cmd.Process.Pid, ""
		}
	}
	log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
	return "", 0, "did not start: " + string(log)
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
