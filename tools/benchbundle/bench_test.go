// Package benchbundle measures what a 10 MiB bundle costs (SPEC 3.6, issue 33): its apply through
// the provider's client (gzip-compressed) to a Host on real PostgreSQL and a runtime node with
// workerd, an update of it, a read of it, and the memory of the organization's workerd process and
// of the process holding the Host and the node. `make bench-bundles`; a benchmark, not a timed
// test: run it on a quiet machine.
package benchbundle

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// bundleBytes is what each bundle holds, a little under the default maxBundleBytes (10 MiB).
const bundleBytes = 10<<20 - 64<<10

// jsBundle is bundleBytes of generated code, as a bundler writes an application: many small
// functions, compressing about as well as minified code does.
func jsBundle(version string) map[string]string {
	var b strings.Builder
	b.WriteString("const v = \"" + version + "\";\n")
	for i := 0; b.Len() < bundleBytes-256; i++ {
		fmt.Fprintf(&b, "function f%d(a,b){return a*%d+b.length+\"%x\"}\n", i, i, sha256.Sum256([]byte(strconv.Itoa(i))))
	}
	b.WriteString("export default { fetch() { return new Response(v + \" \" + typeof f1); } };\n")
	return map[string]string{"index.js": b.String()}
}

// dataBundle is a small module importing bundleBytes of incompressible data, as a WebAssembly or
// data-heavy application is.
func dataBundle(version string) map[string]string {
	data := make([]byte, 0, bundleBytes)
	for i := 0; len(data) < bundleBytes; i++ {
		sum := sha256.Sum256([]byte(version + strconv.Itoa(i)))
		data = append(data, sum[:]...)
	}
	return map[string]string{
		"index.js": "import data from \"./data.bin\";\nexport default { fetch() { return new Response(\"" + version + " \" + data.byteLength); } };\n",
		"data.bin": base64.StdEncoding.EncodeToString(data[:bundleBytes]),
	}
}

// BenchmarkATenMiBBundle reports, per kind of bundle: create (PUT until Ready), update (a new
// version of the same size), read (GET: the Host answers the whole bundle), the organization's
// workerd PSS once the worker serves, and the Go heap of the process that holds the Host, the
// node and this client (the node holds no bundle it has saved: it reads code from its store as
// isolates load; what grows is pgx's buffers, which keep the size of the largest row each pooled
// connection sent, and the client's).
func BenchmarkATenMiBBundle(b *testing.B) {
	for _, kind := range []struct {
		name   string
		bundle func(string) map[string]string
	}{{"js", jsBundle}, {"data", dataBundle}} {
		b.Run(kind.name, func(b *testing.B) {
			h := testhost.Start(b, testhost.Options{})
			c, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key, Timeout: 5 * time.Minute})
			require.NoError(b, err)
			node, err := selfhost.New(h.Runtime.Info.AdminURL, h.Runtime.Info.TokenFile)
			require.NoError(b, err)
			ctx := context.Background()
			heapBefore := heapMiB()
			for i := 0; b.Loop(); i++ {
				name := fmt.Sprintf("big-%d", i)
				spec := func(version string) client.WorkerSpec {
					return client.WorkerSpec{Modules: kind.bundle(version), MainModule: "index.js", CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}}
				}
				v1, v2 := spec("v1"), spec("v2")
				start := time.Now()
				w, _, err := c.PutWorker(ctx, "bench", name, "token-"+name+"-0000000000000", 0, v1)
				require.NoError(b, err)
				require.True(b, w.Ready)
				created := time.Since(start)
				start = time.Now()
				w, _, err = c.PutWorker(ctx, "bench", name, "token-"+name+"-0000000000000", w.Revision, v2)
				require.NoError(b, err)
				require.True(b, w.Ready)
				updated := time.Since(start)
				start = time.Now()
				_, err = c.GetWorker(ctx, "bench", name)
				require.NoError(b, err)
				read := time.Since(start)
				st, err := node.GetScript(ctx, w.ScriptName)
				require.NoError(b, err)
				require.NotZero(b, st.Incarnation.PID)
				b.ReportMetric(created.Seconds(), "create-s")
				b.ReportMetric(updated.Seconds(), "update-s")
				b.ReportMetric(read.Seconds(), "read-s")
				b.ReportMetric(float64(pssKiB(st.Incarnation.PID))/1024, "workerd-PSS-MiB")
				var peak float64
				for _, p := range append(descendants(st.Incarnation.PID), st.Incarnation.PID) {
					peak = max(peak, cgroupPeakMiB(p, cgroupPeakMiB(0, 0)))
				}
				b.ReportMetric(peak, "org-cgroup-peak-MiB")
				b.ReportMetric(heapMiB()-heapBefore, "host+node-heap-MiB")
			}
		})
	}
}

// cgroupPeakMiB is the highest memory use the sandbox cgroup of process pid has seen (its
// organization's process, since it started: both versions' loads), cgroup v1 or v2; 0 when the
// process runs in none of its own (its cgroup's peak is ours, below).
func cgroupPeakMiB(pid int, ours float64) float64 {
	self := "self"
	if pid != 0 {
		self = strconv.Itoa(pid)
	}
	b, err := os.ReadFile("/proc/" + self + "/cgroup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.SplitN(line, ":", 3)
		if len(f) != 3 {
			continue
		}
		file := ""
		switch {
		case f[1] == "memory":
			file = filepath.Join("/sys/fs/cgroup/memory", f[2], "memory.max_usage_in_bytes")
		case f[0] == "0" && f[1] == "":
			file = filepath.Join("/sys/fs/cgroup", f[2], "memory.peak")
		}
		if v, err := os.ReadFile(file); err == nil {
			n, _ := strconv.ParseInt(strings.TrimSpace(string(v)), 10, 64)
			if mib := float64(n) / (1 << 20); n > 0 && mib != ours {
				return mib
			}
		}
	}
	return 0
}

func heapMiB() float64 {
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return float64(m.HeapAlloc) / (1 << 20)
}

// pssKiB is the proportional memory of a process and every process below it (workerd under its
// sandbox).
func pssKiB(pid int) int64 {
	var total int64
	for _, p := range append(descendants(pid), pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
				kib, _ := strconv.ParseInt(f[1], 10, 64)
				total += kib
			}
		}
	}
	return total
}

func descendants(pid int) []int {
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, s := range stats {
		b, err := os.ReadFile(s)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) < 2 {
			continue
		}
		p, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(s, "/proc/"), "/stat"))
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	var out []int
	for next := []int{pid}; len(next) > 0; {
		p := next[0]
		next = next[1:]
		for _, c := range children[p] {
			out = append(out, c)
			next = append(next, c)
		}
	}
	return out
}
