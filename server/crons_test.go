package server_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/host"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// cronModule counts its scheduled runs in its log, one line per tick naming the tick's time.
const cronModule = `export default {
  fetch() { return new Response("ok"); },
  scheduled(event) { console.log("tick " + new Date(event.scheduledTime).toISOString()); },
};`

// skewTo moves database time (every replica's) to the worker's next tick plus by.
func (h *harness) skewToNextTick(by time.Duration) time.Time {
	h.t.Helper()
	var due time.Time
	require.NoError(h.t, h.db.QueryRow(context.Background(), `SELECT next_tick FROM worker_crons WHERE next_tick IS NOT NULL ORDER BY next_tick LIMIT 1`).Scan(&due))
	_, err := h.db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES ($1::timestamptz - now() + make_interval(secs => $2))
ON CONFLICT (singleton) DO UPDATE SET skew = EXCLUDED.skew`, due, by.Seconds())
	require.NoError(h.t, err)
	return due
}

// workerLog is what the worker's log route answers.
func (h *harness) workerLog(space, name string) string {
	h.t.Helper()
	r := h.do(req{method: http.MethodGet, path: "/v1/spaces/" + space + "/workers/" + name + "/logs", key: h.key})
	require.Equal(h.t, http.StatusOK, r.status, string(r.body))
	return string(r.body)
}

// Cron triggers on selfhost (SPEC 3.6), with two Host replicas passing at once on every tick: each
// tick is claimed once, recorded once and run once, its handler's line and its outcome in the
// worker's log; a tick more than 60 s late is recorded missed and not run; a brake on the worker
// stops its ticks; a cron removed, or the worker deleted, stops firing.
func TestCronTicksRunOnceAcrossReplicasAndStopWithTheirWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	other := host.New(host.Config{DB: h.db, Catalog: h.host.Catalog, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	replicas := []*host.Host{h.host, other}
	pass := func() {
		var wg sync.WaitGroup
		for range 3 {
			for _, r := range replicas {
				wg.Go(func() { r.CronPass(context.Background()) })
			}
		}
		wg.Wait()
	}

	body := workerBody()
	body["modules"] = map[string]string{"index.js": cronModule}
	body["crons"] = []string{"*/5 * * * *", "* * * * *", "* * * * *"}
	r := h.putWorker("prod", "cron", tokenA, body)
	require.Equal(t, http.StatusCreated, r.status, string(r.body))
	require.Equal(t, []any{"* * * * *", "*/5 * * * *"}, r.json(t)["crons"], "sorted, without repeats")
	pass()
	require.Equal(t, 2, h.count(`SELECT count(*) FROM worker_crons WHERE next_tick > db_now()`), "each cron has its first tick after now")

	var ticks []time.Time
	for range 3 {
		ticks = append(ticks, h.skewToNextTick(time.Second))
		pass()
	}
	require.Equal(t, 0, h.count(`SELECT count(*) FROM cron_ticks WHERE outcome <> 'ok'`))
	okRows := h.count(`SELECT count(*) FROM cron_ticks WHERE outcome = 'ok'`)
	require.GreaterOrEqual(t, okRows, 3)
	var log string
	require.Eventually(t, func() bool {
		log = h.workerLog("prod", "cron")
		return strings.Count(log, `"message":"tick `) >= okRows
	}, 10*time.Second, 50*time.Millisecond)
	for _, at := range ticks {
		require.Equal(t, h.count(`SELECT count(*) FROM cron_ticks WHERE scheduled_for = $1`, at), strings.Count(log, `tick `+at.UTC().Format("2006-01-02T15:04:05.000Z")),
			"each tick ran once per cron due then, whatever the replicas did:\n%s", log)
	}
	require.Equal(t, okRows, strings.Count(log, `"message":"tick `), log)
	require.Contains(t, log, `scheduled \"* * * * *\" at `+ticks[0].UTC().Format(time.RFC3339)+`: ok`)

	// Five minutes without a Host: the tick is missed, counted, and not run.
	due := h.skewToNextTick(5*time.Minute + time.Second)
	pass()
	require.Equal(t, 1, h.count(`SELECT count(*) FROM cron_ticks WHERE outcome = 'missed' AND scheduled_for = $1 AND cron = '* * * * *' AND missed = 6`, due))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM cron_ticks WHERE outcome = 'ok' AND scheduled_for > $1`, due))

	// A deployment brake on the worker: its ticks are recorded braked, not run.
	brake := ownership.DeploymentBrake{OrganizationID: h.org.ID, Space: "prod", Worker: "cron"}
	require.NoError(t, ownership.SetDeploymentBrake(context.Background(), h.db, brake, true))
	braked := h.skewToNextTick(time.Second)
	pass()
	require.Equal(t, 0, h.count(`SELECT count(*) FROM cron_ticks WHERE scheduled_for = $1 AND outcome <> 'braked'`, braked))
	require.Positive(t, h.count(`SELECT count(*) FROM cron_ticks WHERE scheduled_for = $1`, braked))
	// The node writes a tick's outcome line before it answers the Host: none came.
	require.NotContains(t, h.workerLog("prod", "cron"), `at `+braked.UTC().Format(time.RFC3339)+`: `, "a braked tick is not run")
	require.NoError(t, ownership.SetDeploymentBrake(context.Background(), h.db, brake, false))

	// A cron removed stops firing; the worker deleted leaves no cron at all.
	body["crons"] = []string{"*/5 * * * *"}
	r = h.putWorker("prod", "cron", r.json(t)["ownershipToken"].(string), body)
	require.Equal(t, http.StatusOK, r.status, string(r.body))
	require.Equal(t, 0, h.count(`SELECT count(*) FROM worker_crons WHERE cron = '* * * * *'`))
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "cron", r.json(t)["ownershipToken"].(string)).status)
	require.Equal(t, 0, h.count(`SELECT count(*) FROM worker_crons`))
	before := h.count(`SELECT count(*) FROM cron_ticks`)
	_, err := h.db.Exec(context.Background(), `UPDATE clock_skew SET skew = skew + interval '10 minutes'`)
	require.NoError(t, err)
	pass()
	require.Equal(t, before, h.count(`SELECT count(*) FROM cron_ticks`), "a deleted worker's crons never fire")
}

// On workers-dev Cloudflare runs the crons (SPEC 3.6): the Host sets them through the schedules
// API at each deploy (an update without crons removes them), within the installation's
// cronCeiling across every worker (429 quota_exceeded past it, nothing written); the offering says
// at-least-once.
func TestCronsOnWorkersDevGoThroughTheSchedulesAPIWithinTheCeiling(t *testing.T) {
	t.Parallel()
	h, s := setupWorkersDev(t, cfToken, func(inst map[string]any) { inst["cronCeiling"] = 3 })
	schedules := func(r reply) []string {
		sc, ok := s.Script(r.json(t)["scriptName"].(string))
		require.True(t, ok)
		return sc.Schedules
	}
	b := cfWorkerBody(`export default { fetch() { return new Response("ok") }, scheduled() {} };`)
	b["crons"] = []string{"0 * * * *", "*/5 * * * *"}
	a := h.putWorker("prod", "cron-a", tokenA, b)
	require.Equal(t, http.StatusCreated, a.status, string(a.body))
	require.Equal(t, []string{"*/5 * * * *", "0 * * * *"}, schedules(a))

	r := h.putWorker("prod", "cron-b", tokenB, b)
	r.problem(t, http.StatusTooManyRequests, "quota_exceeded")
	require.Contains(t, string(r.body), "ceiling is 3")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`), "the refused create wrote nothing")

	b["crons"] = []string{"0 * * * *"}
	a = h.putWorker("prod", "cron-a", a.json(t)["ownershipToken"].(string), b)
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Equal(t, []string{"0 * * * *"}, schedules(a))
	b["crons"] = []string{"1 * * * *", "2 * * * *"}
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "cron-b", tokenB, b).status, "1 + 2 crons fit a ceiling of 3")

	delete(b, "crons")
	a = h.putWorker("prod", "cron-a", a.json(t)["ownershipToken"].(string), b)
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	require.Empty(t, schedules(a), "an update without crons removes them")
	require.Zero(t, h.count(`SELECT count(*) FROM worker_crons`), "the Host runs no tick of a Cloudflare worker")

	offerings := h.do(req{method: http.MethodGet, path: "/v1/offerings", key: h.key}).json(t)["offerings"].([]any)
	for _, o := range offerings {
		if o := o.(map[string]any); o["id"] == "cf-worker" {
			require.Equal(t, "at-least-once", o["cronDelivery"])
		}
	}
}

// wfp-managed has no schedules API for dispatch-namespace scripts: a worker with crons is refused
// at once, naming the offering; nothing is written.
func TestCronsOnWFPManagedAreRefused(t *testing.T) {
	t.Parallel()
	h, _ := setupCloudflare(t)
	b := cfWorkerBody(`export default { fetch() { return new Response("ok") } };`)
	b["offeringId"] = "wfp-worker"
	b["crons"] = []string{"* * * * *"}
	r := h.putWorker("prod", "cron", tokenA, b)
	r.problem(t, http.StatusUnprocessableEntity, "crons_unsupported")
	require.Contains(t, string(r.body), "wfp-worker")
	offerings := h.do(req{method: http.MethodGet, path: "/v1/offerings", key: h.key}).json(t)["offerings"].([]any)
	for _, o := range offerings {
		if o := o.(map[string]any); o["id"] == "wfp-worker" {
			require.Nil(t, o["cronDelivery"])
		}
	}
	require.Equal(t, 0, h.count(`SELECT count(*) FROM workers`))
}

// One organization's due ticks never hold back another's (every worker is a tenant's): a replica
// runs at most 4 ticks of one organization at once, leaving the rest due and unclaimed, and a pass
// reads at most 8 due ticks of each organization, so a backlog of one cannot hide another's.
func TestOneOrganizationsCronBacklogLeavesAnothersTicksToRun(t *testing.T) {
	t.Parallel()
	h := setup(t)
	everyMinute := []string{"* * * * *", "*/1 * * * *", "0-59 * * * *", "0-59/1 * * * *", "* 0-23 * * *", "* * 1-31 * *", "* * * 1-12 *", "* * * * 0-6",
		"* */1 * * *", "* * */1 * *", "* * * */1 *", "* * * * */1", "0-59 0-23 * * *", "* * 1-31 1-12 *", "* 0-23 1-31 * *", "0-59 * * * 0-6"}
	busy := workerBody()
	busy["modules"] = map[string]string{"index.js": `export default {
  fetch() { return new Response("ok"); },
  async scheduled(event) { await new Promise((r) => setTimeout(r, 1000)); console.log("busy " + event.cron); },
};`}
	busy["crons"], busy["limits"] = everyMinute, map[string]any{"cpuMs": 2000}
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "busy", tokenA, busy).status)
	other, otherKey := h.newOrg("globex")
	quiet := workerBody()
	quiet["modules"] = map[string]string{"index.js": cronModule}
	quiet["crons"] = []string{"* * * * *"}
	r := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/quiet", key: otherKey, token: tokenB, body: quiet})
	require.Equal(t, http.StatusCreated, r.status, string(r.body))
	h.host.CronPass(context.Background())
	require.Equal(t, 17, h.count(`SELECT count(*) FROM worker_crons WHERE next_tick IS NOT NULL`))

	// The quiet organization's tick comes a second after the busy one's sixteen: a pass reading
	// two per organization, three in all, still reads it.
	_, err := h.db.Exec(context.Background(), `UPDATE worker_crons c SET next_tick = next_tick + interval '1 second'
FROM workers w WHERE w.uid = c.worker_uid AND w.organization_id = $1`, other.ID)
	require.NoError(t, err)
	h.skewToNextTick(90 * time.Second / 60) // past both
	due, err := dbsqlc.New(h.db).CronsDue(context.Background(), dbsqlc.CronsDueParams{PerOrganization: 2, MaxRows: 3})
	require.NoError(t, err)
	orgs := map[string]int{}
	for _, d := range due {
		orgs[d.OrganizationID]++
	}
	require.Equal(t, map[string]int{h.org.ID: 2, other.ID: 1}, orgs)

	h.host.CronPass(context.Background())
	require.Equal(t, 4, h.count(`SELECT count(*) FROM cron_ticks t JOIN workers w ON w.uid = t.worker_uid WHERE w.name = 'busy'`),
		"at most 4 of one organization's ticks run at once on a replica; the rest stay due")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM cron_ticks t JOIN workers w ON w.uid = t.worker_uid WHERE w.name = 'quiet' AND t.outcome = 'ok'`))
	require.Equal(t, 12, h.count(`SELECT count(*) FROM worker_crons c JOIN workers w ON w.uid = c.worker_uid WHERE w.name = 'busy' AND c.next_tick <= db_now()`))
}
