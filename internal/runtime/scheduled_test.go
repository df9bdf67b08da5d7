package runtime_test

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// A cron tick runs the worker's scheduled handler (SPEC 3.6) through the router's own flag: the
// handler sees the cron and the scheduled time, what it prints enters the worker's log with the
// outcome, and a tick id runs at most once: asked again, even at once from many callers, the node
// answers the first run's outcome without running it again. A handler that throws is an
// exception whose text stays in the log; a tick past its deadline, or for another worker UID, is
// refused and runs nothing.
func TestACronTickRunsTheScheduledHandlerOnce(t *testing.T) {
	t.Parallel()
	f := setup(t)
	put := f.scriptPut("uid-cron", 1, "cron")
	put.Modules = map[string]string{"main.js": `let runs = 0;
export default {
  fetch() { return new Response("runs=" + runs); },
  scheduled(event) {
    runs++;
    console.log("tick " + event.cron + " " + new Date(event.scheduledTime).toISOString());
    if (event.cron === "13 * * * *") throw new Error("cron handler failed on purpose");
  },
};`}
	_, err := f.client.PutScript(f.ctx, "cron", put)
	require.NoError(t, err)
	const host = "cron.workers.localhost"
	f.route(host, "cron", "ep-cron")
	f.waitReady("cron")
	f.answers(host, "runs=0")

	at := time.Date(2026, 12, 4, 7, 5, 0, 0, time.UTC)
	run := adminapi.ScheduledRun{TickID: "tick-1", WorkerUID: "uid-cron", Cron: "*/5 * * * *", ScheduledTime: at, Deadline: time.Now().Add(time.Minute)}
	var wg sync.WaitGroup
	outcomes := make([]adminapi.ScheduledOutcome, 8)
	for i := range outcomes {
		wg.Go(func() {
			out, err := f.client.RunScheduled(f.ctx, "cron", run)
			require.NoError(t, err)
			outcomes[i] = out
		})
	}
	wg.Wait()
	for _, o := range outcomes {
		require.Equal(t, adminapi.ScheduledOK, o.Outcome)
		require.NotEmpty(t, o.Incarnation)
	}
	f.answers(host, "runs=1")

	run.TickID, run.Cron = "tick-2", "13 * * * *"
	out, err := f.client.RunScheduled(f.ctx, "cron", run)
	require.NoError(t, err)
	require.Equal(t, adminapi.ScheduledException, out.Outcome)
	require.NotContains(t, out.Message, "on purpose", "the exception's text stays in the log")
	f.answers(host, "runs=2")

	run.TickID, run.Deadline = "tick-3", time.Now().Add(-time.Second)
	_, err = f.client.RunScheduled(f.ctx, "cron", run)
	require.True(t, selfhost.IsCode(err, adminapi.CodeTickExpired), "%v", err)
	run.Deadline, run.WorkerUID = time.Now().Add(time.Minute), "uid-other"
	_, err = f.client.RunScheduled(f.ctx, "cron", run)
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptAbsent), "%v", err)
	f.answers(host, "runs=2")

	var page adminapi.LogPage
	require.Eventually(t, func() bool {
		page, err = f.logs("cron", adminapi.LogQuery{WorkerUID: "uid-cron"})
		return err == nil && strings.Contains(strings.Join(messages(page), "\n"), "on purpose")
	}, 10*time.Second, 20*time.Millisecond)
	all := strings.Join(messages(page), "\n")
	require.Equal(t, 1, strings.Count(all, "tick */5 * * * * 2026-12-04T07:05:00.000Z"), all)
	require.Contains(t, all, `scheduled "*/5 * * * *" at 2026-12-04T07:05:00Z: ok`)
	require.Contains(t, all, `scheduled "13 * * * *" at 2026-12-04T07:05:00Z: exception`)
}
