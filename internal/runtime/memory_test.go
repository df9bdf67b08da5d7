package runtime_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// A busy worker's process levels off well under its memory ceiling. Every request leaves native
// memory behind JavaScript wrappers that V8 frees only when it collects them, and it passes two
// isolates (the router and the worker): with V8's own heuristics, which let an old generation
// grow toward half the heap limit before collecting it, 18,000 requests to a trivial worker took
// its process to its ceiling, where the kernel killed it with the worker implicated (two such
// kills quarantine a worker whose only fault is traffic). 12,000 requests peaked at about 90% of
// the ceiling that way (204 of 228 MiB); with the node's V8 flags, under half (101 MiB).
func TestABusyWorkersProcessLevelsOffWellUnderItsMemoryCeiling(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "busy.workers.localhost"
	first := f.serveWithSecret("busy", "uid-busy", "b1", "canary-busy-3Qe1")
	// The sandbox moves workerd into the process's cgroups, below bwrap.
	procs := descendants(t, first.Incarnation.PID)
	cgroup := memoryCgroup(t, procs[len(procs)-1])

	const requests, clients = 12000, 8
	var sent, failed atomic.Int64
	var lastFailure atomic.Value
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
			for sent.Add(1) <= requests {
				req, _ := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
				req.Host = host
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					lastFailure.Store(err.Error())
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					lastFailure.Store(resp.Status)
				}
			}
		}()
	}
	wg.Wait()
	require.Zero(t, failed.Load(), "failed requests (last: %v)", lastFailure.Load())
	after, err := f.client.GetScript(f.ctx, "busy")
	require.NoError(t, err)
	require.Equal(t, first.Incarnation.PID, after.Incarnation.PID, "the process ended under load: %s", after.Incarnation.Message)
	require.Zero(t, after.Incarnation.Restarts)

	peak, limit := cgroup.read(t)
	t.Logf("%d requests: the process's memory peaked at %d MiB of its %d MiB ceiling", requests, peak>>20, limit>>20)
	require.Less(t, peak, limit*2/3, "the process's memory peak against its ceiling")
}

// memoryFiles names a memory cgroup's high-water mark and ceiling.
type memoryFiles struct{ peak, limit string }

// memoryCgroup finds the memory cgroup of process pid (cgroup v1 or v2).
func memoryCgroup(t *testing.T, pid int) memoryFiles {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	require.NoError(t, err)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case strings.Contains(","+parts[1]+",", ",memory,"):
			dir := filepath.Join("/sys/fs/cgroup/memory", parts[2])
			return memoryFiles{filepath.Join(dir, "memory.max_usage_in_bytes"), filepath.Join(dir, "memory.limit_in_bytes")}
		case parts[0] == "0" && parts[1] == "":
			for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
				dir := filepath.Join(root, parts[2])
				if _, err := os.Stat(filepath.Join(dir, "memory.peak")); err == nil {
					return memoryFiles{filepath.Join(dir, "memory.peak"), filepath.Join(dir, "memory.max")}
				}
			}
		}
	}
	t.Fatalf("process %d is in no memory cgroup: %s", pid, b)
	return memoryFiles{}
}

func (m memoryFiles) read(t *testing.T) (peak, limit int64) {
	t.Helper()
	get := func(path string) int64 {
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		require.NoError(t, err, path)
		return n
	}
	return get(m.peak), get(m.limit)
}
