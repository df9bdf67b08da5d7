package runtime_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/egress"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
)

// loopingSource serves / normally and never returns from /loop.
const loopingSource = `let served = 0;
export default {
  async fetch(req) {
    served++;
    if (new URL(req.url).pathname === "/loop") { while (true) {} }
    return new Response("served=" + served + "\n");
  }
};`

// selfCallingSource calls itself at its own hostname, through the node's edge, and answers what it
// got: a chain of requests that only the edge's loop detection ends.
const selfCallingSource = `export default {
  async fetch(req) {
    const u = new URL(req.url);
    const depth = Number(u.searchParams.get("depth") || "0");
    const r = await fetch("http://" + u.host + "/?depth=" + (depth + 1));
    const h = new Headers(r.headers);
    if (!h.has("x-depth")) h.set("x-depth", String(depth + 1));
    return new Response(r.body, { status: r.status, headers: h });
  }
};`

func (f *fixture) putSource(name, uid, source string) {
	f.t.Helper()
	put := f.scriptPut(uid, 1, "x")
	put.Modules = map[string]string{"main.js": source}
	_, err := f.client.PutScript(f.ctx, name, put)
	require.NoError(f.t, err)
}

func TestLoopingWorkerIsUnresponsiveRestartedAndItsStuckRequestEndsWith5xx(t *testing.T) {
	t.Parallel()
	// Shortened timings (defaults: every 5 s, 2 s each, so ~15 s): 3 misses of 500 ms probes
	// every second; a restart backoff long enough to read the reason.
	f := setup(t, func(c *runtime.Config) {
		c.LivenessPeriod, c.LivenessTimeout = time.Second, 500*time.Millisecond
		c.RestartBackoff, c.MaxRestartBackoff = 2*time.Second, 2*time.Second
	})
	f.putSource("spin", "uid-spin", loopingSource)
	f.route("spin.workers.localhost", "spin", "ep-spin")
	first := f.waitReady("spin")
	f.answers("spin.workers.localhost", "served=1\n")

	began := time.Now()
	type answer struct {
		code int
		err  error
	}
	stuck := make(chan answer, 1)
	go func() {
		code, _, _, err := f.h.TryGet("spin.workers.localhost", "/loop")
		stuck <- answer{code, err}
	}()
	st := f.waitStatus("unresponsive", func(s adminapi.ScriptStatus) bool {
		return !s.Ready && s.Reason == adminapi.ReasonUnresponsive
	}, "spin")
	notReady := time.Since(began)
	require.Contains(t, st.Incarnation.Message, "missed 3 liveness probes")
	require.Less(t, notReady, 6*time.Second, "one period to the first probe, then three missed probes")
	select {
	case a := <-stuck:
		require.NoError(t, a.err)
		require.GreaterOrEqual(t, a.code, 500, "the request stuck on the looping worker ends with a 5xx")
	case <-time.After(10 * time.Second):
		t.Log(f.h.Logs.String())
		t.Fatal("the request stuck on the looping worker still hangs")
	}
	st = f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.PID != first.Incarnation.PID
	}, "spin")
	require.Equal(t, first.Incarnation.ID, st.Incarnation.ID, "continuity restarts the same incarnation")
	require.Equal(t, 1, st.Incarnation.Restarts, "the kill counts toward an incident")
	f.answers("spin.workers.localhost", "served=1\n")
	t.Logf("not Ready %s after the looping request began", notReady.Round(time.Millisecond))
}

// A worker holding its process's thread takes no CPU another organization wants: from the first
// missed probe its organization runs at the least CPU weight, and after liveness killed its
// process it keeps that weight for a while (the loop is usually asked again at once), then gets
// its own back while its new process answers.
func TestAStalledOrganizationYieldsTheCPUUntilItsProcessAnswersAgain(t *testing.T) {
	t.Parallel()
	const suspect = 8 * time.Second
	f := setup(t, func(c *runtime.Config) {
		c.LivenessPeriod, c.LivenessTimeout = time.Second, 500*time.Millisecond
		c.RestartBackoff, c.MaxRestartBackoff = time.Second, time.Second
		c.StalledSuspectFor = suspect
	})
	f.putSource("hog", "uid-hog", loopingSource)
	f.route("hog.workers.localhost", "hog", "ep-hog")
	first := f.waitReady("hog")
	procs := descendants(t, first.Incarnation.PID)
	weight := orgCPUWeight(t, procs[len(procs)-1])
	require.Equal(t, strconv.Itoa(sandbox.DefaultCPUWeight), weight())

	idle := orgCPUIdle(t, procs[len(procs)-1])
	require.Contains(t, []string{"0", "absent"}, idle())

	go func() { _, _, _, _ = f.h.TryGet("hog.workers.localhost", "/loop") }()
	require.Eventually(t, func() bool { return weight() == strconv.Itoa(sandbox.StalledCPUWeight) }, 5*time.Second, 50*time.Millisecond,
		"the organization of a stalled process yields the CPU")
	// Its one process held, it serves no one: where the kernel has cpu.idle, it is also of the idle
	// class, which any other organization's thread that wakes preempts at once.
	require.Eventually(t, func() bool { return idle() == "1" || idle() == "absent" }, 5*time.Second, 10*time.Millisecond,
		"an organization whose every process is held is of the idle class")
	// From here until its new process answers, no new process of the organization runs at its
	// full weight: the new sandbox, workerd's start and the loads are where a loop asked again at
	// once spends the CPU others want. (What is left of the killed one runs none of its code, and
	// frees its memory at the organization's own weight.)
	killed := map[string]bool{}
	for _, pid := range procs {
		killed[strconv.Itoa(pid)] = true
	}
	tasks := orgTasks(t, procs[len(procs)-1], killed)
	done, watched := make(chan struct{}), make(chan []string)
	go func() {
		var atFull []string
		for {
			select {
			case <-done:
				watched <- atFull
				return
			case <-time.After(time.Millisecond):
			}
			if running := tasks(); len(running) > 0 && weight() != strconv.Itoa(sandbox.StalledCPUWeight) {
				atFull = append(atFull, strings.Join(running, ","))
			}
		}
	}()
	st := f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.PID != first.Incarnation.PID
	}, "hog")
	close(done)
	require.Empty(t, <-watched, "processes of an organization killed for a loop ran at its full weight as it started again")
	require.Equal(t, strconv.Itoa(sandbox.StalledCPUWeight), weight(), "an organization killed for a loop still yields the CPU as it starts again")
	require.Contains(t, []string{"0", "absent"}, idle(), "but is of the idle class no more: its new process answers")
	f.answers("hog.workers.localhost", "served=1\n")
	require.Eventually(t, func() bool { return weight() == strconv.Itoa(sandbox.DefaultCPUWeight) }, suspect+5*time.Second, 100*time.Millisecond,
		"a process that answers gets its organization's weight back once the suspicion is over")
	require.Equal(t, st.Incarnation.PID, f.waitReady("hog").Incarnation.PID)
}

// busySource holds its process's thread for n turns of a loop a request, then answers.
const busySource = `export default {
  fetch(req) {
    const n = Number(new URL(req.url).searchParams.get("n") || "0");
    let acc = 0;
    for (let i = 0; i < n; i++) acc = (acc * 31 + i) | 0;
    return new Response("acc=" + acc + "\n");
  }
};`

// A process whose worker holds the thread 200 milliseconds a request, one request after another,
// answers its probes late but answers: it is busy, not held. Its organization yields the CPU while
// a probe waits unanswered (StallAfter), but never enters the idle class, which only a missed probe
// earns: there it would get almost nothing on a busy node, and could miss for that alone.
func TestABusyProcessIsNeverOfTheIdleClass(t *testing.T) {
	t.Parallel()
	// The node's defaults: a probe every second, each allowed 750 ms. A miss needs 1.75 s with
	// nothing answered, eight of the worker's requests; a probe is late (StallAfter) about every
	// other second.
	f := setup(t)
	f.putSource("busy", "uid-busy", busySource)
	f.route("busy.workers.localhost", "busy", "ep-busy")
	first := f.waitReady("busy")
	procs := descendants(t, first.Incarnation.PID)
	idle := orgCPUIdle(t, procs[len(procs)-1])

	// Each request holds the thread for about 200 ms, whatever this machine's speed: twice
	// StallAfter, and a busy CI machine would have to slow it eightfold to miss a probe.
	busy := func(n int) time.Duration {
		began := time.Now()
		code, body, _, err := f.h.TryGet("busy.workers.localhost", "/?n="+strconv.Itoa(n))
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, body)
		return time.Since(began)
	}
	n := 1_000_000
	for range 8 {
		took := busy(n)
		if took > 130*time.Millisecond && took < 250*time.Millisecond {
			break
		}
		n = int(float64(n) * float64(200*time.Millisecond) / float64(max(took, time.Millisecond)))
	}
	t.Logf("%d turns a request", n)
	// The worker is kept busy for 8 s.
	stopIdle := watchIdle(idle)
	var slowest time.Duration
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); {
		slowest = max(slowest, busy(n))
	}
	t.Logf("slowest busy request %s", slowest.Round(time.Millisecond))
	require.Empty(t, stopIdle(), "a process that answers late but answers entered the idle class")
	require.Equal(t, first.Incarnation.PID, f.waitReady("busy").Incarnation.PID, "busy is not stuck: it was not killed")
}

// A load holds the thread as a loop does, but the node asked for it: its organization keeps its
// CPU weight while a large bundle compiles, and is not killed for the probes it misses meanwhile
// (at the least weight, a 10 MiB load on a busy node took its three misses itself, seen in CI).
func TestAnOrganizationLoadingALargeBundleKeepsItsWeightAndItsProcess(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) {
		// Probes every 200 ms, each allowed 150: the load (about 500 ms on an idle machine,
		// seconds on a loaded one) is probed while it runs and misses them, while a probe of
		// the idle process is not missed for a busy machine alone (at 100 ms, each allowed 75, a
		// loaded CI machine missed probes outside the load).
		c.LivenessPeriod = 200 * time.Millisecond
	})
	f.putSource("small", "uid-small", echoSource)
	procs := descendants(t, f.waitReady("small").Incarnation.PID)
	weight := orgCPUWeight(t, procs[len(procs)-1])
	var b strings.Builder
	for i := 0; b.Len() < 10<<20; i++ {
		fmt.Fprintf(&b, "function f%d(a,b){return a*%d+b.length+\"%064x\"}\n", i, i, i)
	}
	b.WriteString("export default { fetch() { return new Response(typeof f1); } };\n")
	f.putSource("large", "uid-large", b.String())
	began := time.Now()
	var seen []string
	for {
		if w := weight(); len(seen) == 0 || seen[len(seen)-1] != w {
			seen = append(seen, w)
		}
		st, err := f.client.GetScript(f.ctx, "large")
		require.NoError(t, err)
		if st.Ready {
			break
		}
		require.NotEqual(t, adminapi.ReasonFailed, st.Reason, "%+v", st.Incarnation)
		require.Less(t, time.Since(began), 30*time.Second, "the large bundle never read Ready")
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, []string{strconv.Itoa(sandbox.DefaultCPUWeight)}, seen, "the organization kept its weight while it loaded")
	require.Equal(t, procs[0], f.waitReady("small").Incarnation.PID, "the load did not end its organization's process")
	t.Logf("a 10 MiB bundle was Ready %s after its put", time.Since(began).Round(time.Millisecond))
}

// A load that never ends is no longer a load: once the allowance has passed, its misses count,
// its process is killed and restarted, the candidate fails for good, and the organization's other
// workers serve again (SPEC 5.1).
func TestACandidateWhoseLoadNeverEndsFailsAfterTheAllowance(t *testing.T) {
	t.Parallel()
	const allowance = 1500 * time.Millisecond
	f := setup(t, func(c *runtime.Config) {
		c.LivenessPeriod, c.LivenessTimeout = 200*time.Millisecond, 150*time.Millisecond
		c.LoadAllowance = allowance
		c.RestartBackoff, c.MaxRestartBackoff = 200*time.Millisecond, 200*time.Millisecond
	})
	f.putSource("steady", "uid-steady", loopingSource)
	f.route("steady.workers.localhost", "steady", "ep-steady")
	first := f.waitReady("steady")
	began := time.Now()
	f.putSource("hang", "uid-hang", "while (true) {}\nexport default { fetch() { return new Response(\"never\"); } };\n")
	st := f.waitStatus("the hanging load failed", func(s adminapi.ScriptStatus) bool { return s.Reason == adminapi.ReasonFailed }, "hang")
	took := time.Since(began)
	require.Contains(t, st.Incarnation.Message, "while it loaded")
	require.Contains(t, st.Incarnation.Message, "after the 1.5s a load may hold its thread")
	require.GreaterOrEqual(t, took, allowance, "its misses counted only after the allowance")
	after := f.waitStatus("steady serves again", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.PID != first.Incarnation.PID
	}, "steady")
	require.Equal(t, 1, after.Incarnation.Restarts)
	f.answers("steady.workers.localhost", "served=1\n")
	// Never loaded again: the process it ended stays up.
	time.Sleep(2 * allowance)
	require.Equal(t, after.Incarnation.PID, f.waitReady("steady").Incarnation.PID)
	t.Logf("a load that never ended failed %s after its put", took.Round(time.Millisecond))
}

// orgTasks lists, on each call, the tasks in the CPU cgroups of the organization whose sandboxed
// process pid is in (every process of the organization has a cgroup below its organization's),
// but those in except.
func orgTasks(t *testing.T, pid int, except map[string]bool) func() []string {
	t.Helper()
	org := filepath.Dir(orgCPUFile(t, pid))
	return func() []string {
		var tasks []string
		files, _ := filepath.Glob(filepath.Join(org, "*", "cgroup.procs"))
		for _, file := range files {
			b, _ := os.ReadFile(file) // a group removed meanwhile holds no task
			for _, task := range strings.Fields(string(b)) {
				if !except[task] {
					tasks = append(tasks, task)
				}
			}
		}
		return tasks
	}
}

// orgCPUIdle reads, on each call, cpu.idle of the organization whose sandboxed process pid is in
// ("absent" where the kernel has none, which fails under CI=true: CI's kernel has it).
func orgCPUIdle(t *testing.T, pid int) func() string {
	t.Helper()
	file := filepath.Join(filepath.Dir(orgCPUFile(t, pid)), "cpu.idle")
	if os.Getenv("CI") == "true" {
		_, err := os.Stat(file)
		require.NoError(t, err, "the kernel has no cpu.idle here; the idle class is not tested")
	}
	return func() string {
		b, err := os.ReadFile(file)
		if errors.Is(err, fs.ErrNotExist) {
			return "absent"
		} else if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(string(b))
	}
}

// watchIdle reads idle (orgCPUIdle) every few milliseconds until the function it returns is
// called, which answers the values read other than "0" and "absent".
func watchIdle(idle func() string) func() []string {
	done, sampled := make(chan struct{}), make(chan []string, 1)
	go func() {
		var seen []string
		for {
			select {
			case <-done:
				sampled <- seen
				return
			case <-time.After(2 * time.Millisecond):
			}
			if v := idle(); v != "0" && v != "absent" {
				seen = append(seen, v)
			}
		}
	}()
	return func() []string {
		close(done)
		return <-sampled
	}
}

// orgCPUWeight reads, on each call, the CPU weight of the organization whose sandboxed process
// pid is in (the parent of its process's cgroup): cpu.weight on v2, cpu.shares on v1, where it
// reads as the weight the runtime wrote it for (shares are the weight scaled by 1024/100, at
// least 2).
func orgCPUWeight(t *testing.T, pid int) func() string {
	t.Helper()
	file := orgCPUFile(t, pid)
	idle := orgCPUIdle(t, pid)
	return func() string {
		if idle() == "1" {
			// The kernel reports an idle group's own weight (3 in shares) and refuses another:
			// the runtime writes the least weight before it makes the group idle.
			return strconv.Itoa(sandbox.StalledCPUWeight)
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return err.Error()
		}
		v := strings.TrimSpace(string(b))
		if filepath.Base(file) == "cpu.shares" {
			for _, w := range []int{sandbox.DefaultCPUWeight, sandbox.StalledCPUWeight} {
				if v == strconv.Itoa(max(2, w*1024/100)) {
					return strconv.Itoa(w)
				}
			}
			return "shares " + v
		}
		return v
	}
}

// orgCPUFile is the file holding the CPU weight of the organization whose sandboxed process pid
// is in: cpu.weight on v2, cpu.shares on v1.
func orgCPUFile(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	require.NoError(t, err)
	var file string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		switch {
		case len(parts) != 3:
		case strings.Contains(","+parts[1]+",", ",cpu,"):
			file = filepath.Join("/sys/fs/cgroup", parts[1], filepath.Dir(parts[2]), "cpu.shares")
		case parts[0] == "0" && parts[1] == "" && file == "":
			file = filepath.Join("/sys/fs/cgroup", filepath.Dir(parts[2]), "cpu.weight")
		}
	}
	require.NotEmpty(t, file, "process %d is in no CPU cgroup: %s", pid, b)
	return file
}

func TestWorkerCallingItselfThroughTheEdgeEndsWith508(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.putSource("echo", "uid-echo", selfCallingSource)
	f.route("echo.workers.localhost", "echo", "ep-echo")
	f.waitReady("echo")

	began := time.Now()
	req, err := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
	require.NoError(t, err)
	req.Host = "echo.workers.localhost"
	resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	took := time.Since(began)
	require.Equal(t, http.StatusLoopDetected, resp.StatusCode, "%s", body)
	var p adminapi.Problem
	require.NoError(t, json.Unmarshal(body, &p))
	require.Equal(t, adminapi.CodeLoopDetected, p.Code)
	require.Equal(t, fmt.Sprint(edge.MaxEgressLoop+1), resp.Header.Get("X-Depth"),
		"the edge let %d calls from this node's egress through, and refused the next", edge.MaxEgressLoop)
	require.Less(t, took, 5*time.Second, "fast")
	// The node serves the worker again at once: nothing stays counted.
	st, err := f.client.GetScript(f.ctx, "echo")
	require.NoError(t, err)
	require.True(t, st.Ready)
	t.Logf("a worker calling itself through the edge ended with 508 in %s", took.Round(time.Millisecond))
}

// TestABusyWorkerThatAnswersIsNotKilledForLateProbes: under load a probe can come back late while
// the worker keeps answering requests; those answers witness that it is not stuck, so it is not
// killed. Once it answers nothing either, the missed probes kill it as before. (Probes here can
// never succeed: each is allowed one nanosecond.)
func TestABusyWorkerThatAnswersIsNotKilledForLateProbes(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *runtime.Config) {
		// A period long enough that a loaded machine's pause between two requests never spans
		// one whole period.
		c.LivenessPeriod, c.LivenessTimeout = time.Second, time.Nanosecond
		c.RestartBackoff, c.MaxRestartBackoff = 5*time.Second, 5*time.Second
	})
	f.putSource("busy", "uid-busy", loopingSource)
	f.route("busy.workers.localhost", "busy", "ep-busy")
	first := f.waitReady("busy")

	// Answering: four probe periods pass with every probe late, and the worker stays.
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		code, _, _, err := f.h.TryGet("busy.workers.localhost", "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	}
	st, err := f.client.GetScript(f.ctx, "busy")
	require.NoError(t, err)
	require.True(t, st.Ready, "%s: %s", st.Reason, st.Incarnation.Message)
	require.Equal(t, first.Incarnation.PID, st.Incarnation.PID, "a worker that answers is not killed for late probes")

	// Silent: three late probes in a row with no answer between them, and it is killed.
	f.waitStatus("killed for missed probes", func(s adminapi.ScriptStatus) bool {
		return s.Reason == adminapi.ReasonUnresponsive || (s.Incarnation != nil && s.Incarnation.Restarts > 0)
	}, "busy")
}

// poller calls a host through the edge every 20 ms from its own goroutine and records, for each
// call, when it began, how long it took and whether it was answered 200.
type poller struct {
	mu    sync.Mutex
	calls []polled
	stop  chan struct{}
	done  chan struct{}
}

type polled struct {
	at   time.Time
	took time.Duration
	ok   bool
	err  string // why it failed
}

func (f *fixture) poll(host string) *poller {
	p := &poller{stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 15 * time.Second}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
			began := time.Now()
			call := polled{at: began, ok: true}
			if err := getOK(client, "http://"+f.h.Info.EdgeAddr+"/", host); err != nil {
				call.ok, call.err = false, err.Error()
			}
			call.took = time.Since(began)
			p.mu.Lock()
			p.calls = append(p.calls, call)
			p.mu.Unlock()
		}
	}()
	return p
}

// finish stops the poller and returns its calls.
func (p *poller) finish() []polled {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

// failures are why the calls at or after since failed.
func failures(calls []polled, since time.Time) []string {
	var out []string
	for _, c := range calls {
		if !c.ok && !c.at.Before(since) {
			out = append(out, c.err)
		}
	}
	return out
}

// stalled is how long, from since on, the calls went without an answered one: from since to the
// end of the first answered call that began after since, at least.
func stalled(calls []polled, since time.Time) time.Duration {
	for _, c := range calls {
		if c.ok && !c.at.Before(since) {
			return c.at.Add(c.took).Sub(since)
		}
	}
	return time.Hour
}

// slowest is the longest call at or after since, and how many failed.
func slowest(calls []polled, since time.Time) (time.Duration, int) {
	var most time.Duration
	failed := 0
	for _, c := range calls {
		if c.at.Before(since) {
			continue
		}
		most = max(most, c.took)
		if !c.ok {
			failed++
		}
	}
	return most, failed
}

// A worker in a loop holds its organization's process's one thread: its organization's other
// workers on the node stall until liveness kills the process (three missed probes a second
// apart, about 3 s) and are served again at once; another organization's are not held at all.
// Implicated twice, the looping worker runs alone, and its next loop stalls no other worker (SPEC
// 5.1: liveness and quarantine).
func TestALoopingWorkerStallsOnlyItsOrganizationAndForAboutThreeSeconds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("looper", "org-loop", "uid-loop", loopingSource)
	f.orgScript("sibling", "org-loop", "uid-sib", loopingSource)
	f.orgScript("other", "org-other", "uid-other", loopingSource)
	f.servedAt("looper", "sibling", "other")
	sibling, other := f.poll("sibling.test"), f.poll("other.test")
	var loops []time.Time
	var idleWhileAlone []string
	for round := 1; round <= 3; round++ {
		loops = append(loops, time.Now())
		stopIdle := func() []string { return nil }
		if round == 3 {
			// The looper runs alone now, and its organization's shared process answers: the
			// organization is never of the idle class meanwhile (on a saturated node its other
			// workers would get nothing).
			st, err := f.client.GetScript(f.ctx, "sibling")
			require.NoError(t, err)
			procs := descendants(t, st.Incarnation.PID)
			stopIdle = watchIdle(orgCPUIdle(t, procs[len(procs)-1]))
		}
		code, _, _, _ := f.h.TryGet("looper.test", "/loop")
		idleWhileAlone = stopIdle()
		require.GreaterOrEqual(t, code, 500, "round %d: the looping request ends with its process", round)
		f.waitStatus("the looper back", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Restarts >= round
		}, "looper")
		f.servedAny("sibling.test")
	}
	siblingCalls, otherCalls := sibling.finish(), other.finish()

	for round, at := range loops[:2] {
		stall := stalled(siblingCalls, at)
		t.Logf("round %d: the looper's sibling went %s without an answer", round+1, stall.Round(time.Millisecond))
		// Three missed probes a second apart (3 to 4 s), then the organization's process restarts
		// and loads its isolates again, which took up to 2.5 s more on a loaded CI machine. Ten
		// misses, or no kill at all, would stall it for longer than this bound.
		require.Less(t, stall, 9*time.Second, "round %d: its organization stalls for about the liveness bound plus a restart, then is served again", round+1)
	}
	st, err := f.client.GetScript(f.ctx, "looper")
	require.NoError(t, err)
	require.True(t, st.Quarantined, "implicated twice within an hour: it runs alone")
	require.Contains(t, st.QuarantineMessage, "a process of its own")
	// Its sibling, asked every few milliseconds, had requests in flight at both kills, queued
	// behind the loop: it is not to blame, and stays in its organization's shared process.
	sib, err := f.client.GetScript(f.ctx, "sibling")
	require.NoError(t, err)
	require.False(t, sib.Quarantined, "the sibling was quarantined with the looper: %s", sib.QuarantineMessage)
	require.NotEqual(t, st.Incarnation.PID, sib.Incarnation.PID)
	// The third loop holds the looper's own process only.
	most, failed := slowest(siblingCalls, loops[2])
	t.Logf("round 3, the looper alone: its sibling's slowest call %s, %d failed", most.Round(time.Millisecond), failed)
	require.Zero(t, failed, "a quarantined worker's loop fails none of its organization's other requests")
	require.Less(t, most, time.Second, "nor stalls them")
	require.Empty(t, idleWhileAlone, "nor makes its organization of the idle class")
	most, failed = slowest(otherCalls, loops[0])
	t.Logf("another organization, throughout: slowest call %s, %d failed", most.Round(time.Millisecond), failed)
	require.Zero(t, failed, "another organization's requests never fail for the loop")
	require.Less(t, most, time.Second, "nor stall")
}

// spinUID is the worker UID of a binding's callee that loops.
const spinUID = "0b9c6f1e-2f53-4d8e-9a3c-000000000006"

// A loop in a binding's callee is the callee's: the request that took the thread is its caller's,
// and the call it made is implicated with it, so the callee runs alone after two kills; a sibling
// with requests queued behind the loop does not (SPEC 5.1).
func TestALoopInABindingsCalleeQuarantinesTheCallee(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("spinner", "org-bind", spinUID, `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/who") { while (true) {} }
    return new Response("spinner\n");
  }
};`)
	f.caller("front", "uid-front", "org-bind", 1, map[string]string{"AUTH": spinUID})
	f.orgScript("sibling", "org-bind", "uid-sib", loopingSource)
	f.servedAt("spinner", "front", "sibling")
	sibling := f.poll("sibling.test")
	defer sibling.finish()
	for round := 1; round <= 2; round++ {
		code, _, _, _ := f.h.TryGet("front.test", "/")
		require.GreaterOrEqual(t, code, 500, "round %d: the call loops until its process ends", round)
		f.waitStatus("the callee back", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Restarts >= round
		}, "spinner")
		f.servedAny("sibling.test")
	}
	st, err := f.client.GetScript(f.ctx, "spinner")
	require.NoError(t, err)
	require.True(t, st.Quarantined, "the looping callee, implicated through its caller's call, runs alone")
	sib, err := f.client.GetScript(f.ctx, "sibling")
	require.NoError(t, err)
	require.False(t, sib.Quarantined, "the sibling was quarantined with the callee: %s", sib.QuarantineMessage)

	// Alone, it is called from another process, through the edge: each call handed back to be
	// carried whole is no answer of its process, so its loop is ended however often it is called
	// (a caller that gives up after 100 ms, so that its calls in flight never reach its cap:
	// each hand-back used to count as an answer, and the loop went on as long as they came).
	f.callerOf("impatient", "uid-impatient", "org-bind", 1, `export default {
  async fetch(req, env) {
    try {
      await env.AUTH.fetch("http://auth.internal/who", { signal: AbortSignal.timeout(100) });
    } catch (e) {}
    return new Response("gave up\n");
  }
};`, map[string]string{"AUTH": spinUID})
	f.route("impatient.test", "impatient", "ep-impatient")
	f.waitReady("impatient")
	st, err = f.client.GetScript(f.ctx, "spinner")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(f.ctx)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			go func() { _, _, _, _ = f.h.TryGet("impatient.test", "/") }()
			select {
			case <-ctx.Done():
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	f.waitStatus("the quarantined callee killed for its loop while it is called", func(s adminapi.ScriptStatus) bool {
		return s.Incarnation.Restarts > st.Incarnation.Restarts
	}, "spinner")
	cancel()

	// A call handed back holds one of the caller's subrequests in flight only until it is handed
	// back: more sequential calls than a worker may have in flight all answer.
	f.callerOf("patient", "uid-patient", "org-bind", 1, strings.Replace(callerSource, "auth.internal/who", "auth.internal/", 1),
		map[string]string{"AUTH": spinUID})
	f.route("patient.test", "patient", "ep-patient")
	f.waitReady("patient")
	// The impatient caller's last call may still loop until the callee is killed once more.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body, _, err := f.h.TryGet("patient.test", "/")
		if err == nil && body == "via binding 200: spinner\n" {
			break
		}
		require.True(t, time.Now().Before(deadline), "the callee answers again: %d %q %v", code, body, err)
	}
	for i := range egress.DefaultSubrequestLimit + 10 {
		code, body, _, err := f.h.TryGet("patient.test", "/")
		require.NoError(t, err)
		require.Equal(t, "via binding 200: spinner\n", body, "call %d (%d)", i+1, code)
	}
}

// A WebSocket is in flight across every answer of its process for as long as its client stays. A
// liveness kill blames requests whose answer began only when no other request waits for its
// answer, so an organization's open WebSocket is not blamed for another worker's loop: it was, and
// its worker was quarantined (its WebSockets cut at each kill) while the looper stayed.
func TestAnOpenWebSocketIsNotBlamedForAnotherWorkersLoop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("chat", "org-ws", "uid-chat", echoSource)
	f.orgScript("looper", "org-ws", "uid-loop", loopingSource)
	f.servedAt("chat", "looper")
	f.blamedAlone("looper", "chat", func(round int) func() {
		ws := f.webSocket("chat.test")
		code, _, _, _ := f.h.TryGet("looper.test", "/loop")
		require.GreaterOrEqual(t, code, 500, "round %d: the loop ends with its process", round)
		return func() { ws.Close() }
	})
}

// A worker awaiting a slow fetch is not blamed for another worker's loop: its request was in flight
// across the process's last answer, which alone used to implicate it (and let the looper go, its
// request begun on a free thread); a request may now be waiting for a subrequest of its worker's
// still in flight at the kill, begun after it. The slow upstream is another organization's worker
// on the node, reached through the egress.
func TestAWorkerAwaitingASlowFetchIsNotBlamedForAnotherWorkersLoop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("slow", "org-upstream", "uid-slow", `export default {
  async fetch() {
    await new Promise((resolve) => setTimeout(resolve, 20000));
    return new Response("late\n");
  }
};`)
	f.orgScript("fetcher", "org-fetch", "uid-fetcher", `export default {
  async fetch() {
    const r = await fetch("http://slow.test/");
    return new Response("upstream: " + await r.text());
  }
};`)
	f.orgScript("looper", "org-fetch", "uid-loop", loopingSource)
	f.servedAt("slow", "fetcher", "looper")
	f.blamedAlone("looper", "fetcher", func(round int) func() {
		f.fetchingThrough("fetcher", "slow")
		// The process answers once more while the fetcher waits, so its request is in flight across
		// that answer.
		f.servedAny("looper.test")
		code, _, _, _ := f.h.TryGet("looper.test", "/loop")
		require.GreaterOrEqual(t, code, 500, "round %d: the loop ends with its process", round)
		return func() {}
	})
}

// A worker that loops while it reads a fetch's body, the fetch still in flight, is blamed, not a
// sibling whose request came after the loop began: the fetch, sent before the process's last
// answer, was answered after it (the egress notes when an answer begins), so its request may have
// gone on from the answer, and is judged as any in flight across the last answer. (Were a
// subrequest in flight enough to excuse its request, or its answer not noted, the sibling would be
// blamed.)
func TestAWorkerLoopingOverAFetchsBodyIsBlamedNotTheSiblingQueuedBehindIt(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("drip", "org-upstream", "uid-drip", `export default {
  async fetch() {
    await new Promise((resolve) => setTimeout(resolve, 700));
    const { readable, writable } = new TransformStream();
    const writer = writable.getWriter();
    writer.write(new TextEncoder().encode("first chunk\n"));
    setTimeout(() => writer.close(), 20000);
    return new Response(readable);
  }
};`)
	f.orgScript("reader", "org-read", "uid-reader", `export default {
  async fetch() {
    const r = await fetch("http://drip.test/");
    await r.body.getReader().read();
    while (true) {}
  }
};`)
	f.orgScript("sibling", "org-read", "uid-sibling", loopingSource)
	f.servedAt("drip", "reader", "sibling")
	f.blamedAlone("reader", "sibling", func(round int) func() {
		f.fetchingThrough("reader", "drip")
		// The process answers while the fetch waits for its upstream (700 ms).
		f.servedAny("sibling.test")
		time.Sleep(time.Second) // the upstream answers, its first chunk comes, and the loop begins
		go func() { _, _, _, _ = f.h.TryGet("sibling.test", "/") }()
		return func() {}
	})
}

// servedAt routes each name's endpoint at <name>.test and waits until each is Ready.
func (f *fixture) servedAt(names ...string) {
	f.t.Helper()
	for _, name := range names {
		f.route(name+".test", name, "ep-"+name)
		f.waitReady(name)
	}
}

// fetchingThrough sends a request to worker's endpoint in the background, and waits until the
// subrequest it makes has reached upstream.
func (f *fixture) fetchingThrough(worker, upstream string) {
	f.t.Helper()
	waiting := f.h.Node.InFlight(upstream)
	go func() { _, _, _, _ = f.h.TryGet(worker+".test", "/") }()
	require.Eventually(f.t, func() bool { return f.h.Node.InFlight(upstream) > waiting }, 10*time.Second, 10*time.Millisecond,
		"%s's subrequest reached %s", worker, upstream)
}

// blamedAlone runs loop twice, each time until looper's process was killed and looper is back,
// then closes what loop opened; looper must run alone, implicated twice, and innocent not.
func (f *fixture) blamedAlone(looper, innocent string, loop func(round int) (closeAll func())) {
	f.t.Helper()
	for round := 1; round <= 2; round++ {
		closeAll := loop(round)
		f.waitStatus("the looper back", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Restarts >= round
		}, looper)
		closeAll()
	}
	st, err := f.client.GetScript(f.ctx, looper)
	require.NoError(f.t, err)
	require.True(f.t, st.Quarantined, "%s, implicated twice, runs alone", looper)
	st, err = f.client.GetScript(f.ctx, innocent)
	require.NoError(f.t, err)
	require.False(f.t, st.Quarantined, "%s was blamed: %s", innocent, st.QuarantineMessage)
}

// A loop in a WebSocket's message handler is blamed on that worker alone: its message, sent after
// the worker last sent anything, is a request waiting for its answer, while another worker's open
// WebSocket, whose last message was answered, waits for nothing (before, both were blamed).
// Requests that arrive within a fraction of a millisecond of each other cannot be told apart: a
// sibling's request that began just before the message is blamed instead (README).
func TestALoopInAWebSocketsHandlerIsBlamedOnItsWorkerAlone(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("wsloop", "org-wsl", "uid-wsloop", `export default {
  async fetch(req) {
    const [client, server] = Object.values(new WebSocketPair());
    server.accept();
    server.addEventListener("message", (e) => {
      if (e.data === "loop") { while (true) {} }
      server.send("echo:" + e.data);
    });
    return new Response(null, { status: 101, webSocket: client });
  }
};`)
	f.orgScript("chat", "org-wsl", "uid-chat", echoSource)
	f.servedAt("wsloop", "chat")
	f.blamedAlone("wsloop", "chat", func(int) func() {
		chat := f.webSocket("chat.test")
		ws := f.webSocket("wsloop.test")
		_, err := ws.Write(append([]byte{0x81, 0x80 | 4, 0, 0, 0, 0}, "loop"...))
		require.NoError(t, err)
		return func() { ws.Close(); chat.Close() }
	})
}

// webSocket opens a WebSocket to host's /ws through the edge (a worker that echoes "echo:" and
// each message) and checks that it echoes.
func (f *fixture) webSocket(host string) *rawConn {
	f.t.Helper()
	conn := dial(f.t, f.h.Info.EdgeAddr, "")
	_, err := fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n", host)
	require.NoError(f.t, err)
	require.NoError(f.t, conn.SetReadDeadline(time.Now().Add(10*time.Second)))
	resp, err := http.ReadResponse(conn.br, nil)
	require.NoError(f.t, err)
	require.Equal(f.t, http.StatusSwitchingProtocols, resp.StatusCode)
	// One masked text frame (RFC 6455 5.2), mask 0.
	_, err = conn.Write(append([]byte{0x81, 0x80 | 2, 0, 0, 0, 0}, "hi"...))
	require.NoError(f.t, err)
	got := make([]byte, 2+len("echo:hi"))
	_, err = io.ReadFull(conn.br, got)
	require.NoError(f.t, err)
	require.Equal(f.t, "echo:hi", string(got[2:]))
	return conn
}

// servedAny waits until host answers 200 and returns its body.
func (f *fixture) servedAny(host string) string {
	f.t.Helper()
	var body string
	require.Eventually(f.t, func() bool {
		code, b, _, err := f.h.TryGet(host, "/")
		body = b
		return err == nil && code == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond, "%s answers", host)
	return body
}

// Readiness never runs a worker's handler (SPEC 5: a worker that sends an email per request must
// not send one per deploy): the probe loads the isolate and calls an entrypoint no module
// exports, so the first request after Ready is the handler's first call, in the very isolate the
// probe loaded. Its top level did run (an error there fails the deployment with workerd's own
// words, scrubbed, in the status and the worker's log).
func TestTheProbeNeverRunsTheWorkersHandler(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.putSource("counted", "uid-count", `let calls = 0;
const loaded = Date.now();
export default {
  fetch() {
    calls++;
    return new Response("calls=" + calls + " loaded=" + loaded + "\n");
  }
};`)
	f.route("counted.test", "counted", "ep-count")
	f.waitReady("counted")
	_, first, _ := f.h.Get(t, "counted.test", "/")
	require.True(t, strings.HasPrefix(first, "calls=1 "), "the probe called the handler: %s", first)
	_, second, _ := f.h.Get(t, "counted.test", "/")
	require.Equal(t, strings.Replace(first, "calls=1", "calls=2", 1), second, "one isolate, loaded once (by the probe)")

	put := f.scriptPut("uid-broken", 1, "x")
	put.Modules = map[string]string{"main.js": "const x = ; export default {}"}
	_, err := f.client.PutScript(f.ctx, "broken", put)
	require.NoError(t, err)
	st := f.waitStatus("the broken code failed", func(s adminapi.ScriptStatus) bool { return s.Reason == adminapi.ReasonFailed }, "broken")
	require.Contains(t, st.Incarnation.Message, "SyntaxError", "workerd's own words")
	lines := f.workerLines("broken", "uid-broken", func(l []string) bool { return len(l) > 0 })
	require.Contains(t, lines[0], "SyntaxError")
}
