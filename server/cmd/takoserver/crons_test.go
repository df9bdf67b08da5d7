package main_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Cron triggers with real processes (SPEC 3.6): two takoserver replicas run their cron passes
// every second against one database, and a tick every minute comes as the test moves the
// database's clock to it. Each tick is claimed by one replica, recorded once and run once on the
// node: the worker's log has one line per tick.
func TestTwoReplicasNeverFireOneTickTwice(t *testing.T) {
	t.Parallel()
	p := newPair(t)
	worker, err := json.Marshal(map[string]any{
		"modules": map[string]string{"index.js": `export default {
  fetch() { return new Response("ok"); },
  scheduled(event) { console.log("tick " + new Date(event.scheduledTime).toISOString()); },
};`},
		"mainModule": "index.js", "compatibilityDate": "2025-01-01", "requiredSensitiveVars": []string{},
		"crons": []string{"* * * * *"},
	})
	require.NoError(t, err)
	p.must(0, http.MethodPut, workerPath("cron"), "token-cron-worker-000001", string(worker), http.StatusCreated)

	nextTick := func() time.Time {
		var at *time.Time
		require.Eventually(t, func() bool {
			require.NoError(t, p.db.QueryRow(context.Background(), `SELECT next_tick FROM worker_crons`).Scan(&at))
			return at != nil
		}, 10*time.Second, 50*time.Millisecond, "a replica computes the first tick")
		return *at
	}
	var ticks []time.Time
	for range 3 {
		due := nextTick()
		_, err := p.db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES ($1::timestamptz - now() + interval '1 second')
ON CONFLICT (singleton) DO UPDATE SET skew = EXCLUDED.skew`, due)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var outcome string
			err := p.db.QueryRow(context.Background(), `SELECT outcome::text FROM cron_ticks WHERE scheduled_for = $1`, due).Scan(&outcome)
			return err == nil && outcome == "ok"
		}, 20*time.Second, 50*time.Millisecond, "the tick due at %s runs", due)
		ticks = append(ticks, due)
		time.Sleep(1500 * time.Millisecond) // both replicas pass again over the moved clock
	}
	var rows int
	require.NoError(t, p.db.QueryRow(context.Background(), `SELECT count(*) FROM cron_ticks`).Scan(&rows))
	require.Equal(t, len(ticks), rows, "one record per tick")

	var log string
	require.Eventually(t, func() bool {
		a, err := p.send(1, http.MethodGet, workerPath("cron")+"/logs", "", "")
		log = a.body
		return err == nil && strings.Count(log, `"message":"tick `) >= len(ticks)
	}, 10*time.Second, 100*time.Millisecond)
	for _, at := range ticks {
		require.Equal(t, 1, strings.Count(log, `"message":"tick `+at.UTC().Format("2006-01-02T15:04:05.000Z")), "the tick at %s ran once:\n%s", at, log)
	}
	require.Equal(t, len(ticks), strings.Count(log, `"message":"tick `), log)
}
