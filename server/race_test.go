package server_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// legal lists every status change a reservation may make (SPEC 3.3's lifecycle; bound -> bound
// is a re-bind or an in-place witness clear).
var legal = map[[2]string]bool{
	{"prepared", "bound"}: true, {"bound", "activated"}: true, {"activated", "bound"}: true,
	{"bound", "bound"}: true, {"prepared", "expired"}: true, {"bound", "expired"}: true,
	{"prepared", "released"}: true, {"bound", "released"}: true, {"expired", "released"}: true,
}

// TestConcurrentActivationDeactivationAndReleaseStayLegal races activation cycles against the
// safe-order teardown (endpoint delete, then release). Whatever interleaving happens, every
// transition is legal, revisions strictly increase, and nothing answers 5xx.
func TestConcurrentActivationDeactivationAndReleaseStayLegal(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.exec(`CREATE TABLE transitions (seq bigserial PRIMARY KEY, old_status text, new_status text, old_revision bigint, new_revision bigint)`)
	h.exec(`CREATE FUNCTION log_transition() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO transitions (old_status, new_status, old_revision, new_revision)
			VALUES (OLD.status, NEW.status, OLD.revision, NEW.revision);
			RETURN NEW;
		END $$`)
	h.exec(`CREATE TRIGGER log_transition AFTER UPDATE ON worker_endpoint_origin_reservations FOR EACH ROW EXECUTE FUNCTION log_transition()`)

	require.Equal(t, http.StatusCreated, h.putReservation(h.key, "res-api", tokenA, apiBody("prod", "api")).status)
	h.mustWorker("prod", "api", workerToken)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})

	// Both sides start together behind a barrier; neither calls require (only this goroutine may).
	// After every answer the custody invariant is checked in SQL by the test's goroutine, from the
	// answers the workers hand back.
	var wg sync.WaitGroup
	statuses := make(chan int, 1000)
	failures := make(chan error, 1000)
	start := make(chan struct{})
	activated := make(chan struct{}) // closed at the first activation (or when the cycles end)
	var activatedOnce sync.Once
	send := func(r req) int {
		rep, err := h.try(r)
		if err != nil {
			failures <- err
			return 0
		}
		statuses <- rep.status
		return rep.status
	}
	wg.Add(2)
	go func() { // activation cycles, a fresh token per cycle (a deleted activation's token is tombstoned)
		defer wg.Done()
		<-start
		defer activatedOnce.Do(func() { close(activated) })
		for i := range 15 {
			token := fmt.Sprintf("token-cycle-%010d", i)
			if send(req{method: http.MethodPut, path: resPath + "res-api/activation", key: h.key, token: token, body: map[string]any{"endpointUid": e["uid"]}}) == http.StatusOK {
				activatedOnce.Do(func() { close(activated) })
			}
			send(req{method: http.MethodDelete, path: resPath + "res-api/activation", key: h.key, token: token})
		}
	}()
	go func() { // the teardown, retried until it gets through in the safe order
		defer wg.Done()
		<-start
		<-activated // once an activation landed, so that the teardown races real cycles
		for range 200 {
			if send(req{method: http.MethodDelete, path: "/v1/spaces/prod/worker-endpoints/api", key: h.key, token: endpointToken}) == http.StatusOK {
				break
			}
		}
		for range 200 {
			if send(req{method: http.MethodDelete, path: resPath + "res-api", key: h.key, token: tokenA}) == http.StatusOK {
				break
			}
		}
	}()
	close(start)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			h.custodyHolds()
		}
	}
	close(statuses)
	close(failures)
	for err := range failures {
		require.NoError(t, err)
	}
	for s := range statuses {
		require.Less(t, s, 500, "no request may fail with a server error")
	}
	h.custodyHolds()

	rows, err := h.db.Query(context.Background(), "SELECT old_status, new_status, old_revision, new_revision FROM transitions ORDER BY seq")
	require.NoError(t, err)
	defer rows.Close()
	var last int64
	n := 0
	for rows.Next() {
		var from, to string
		var oldRev, newRev int64
		require.NoError(t, rows.Scan(&from, &to, &oldRev, &newRev))
		require.True(t, legal[[2]string{from, to}], "illegal transition %s -> %s", from, to)
		require.Greater(t, newRev, oldRev)
		require.Greater(t, newRev, last, "revisions strictly increase")
		last = newRev
		n++
	}
	require.NoError(t, rows.Err())
	require.GreaterOrEqual(t, n, 3, "bound, activated, and the release at least")
	require.Equal(t, "released", func() string {
		var s string
		require.NoError(t, h.db.QueryRow(context.Background(), "SELECT status FROM worker_endpoint_origin_reservations WHERE id = 'res-api'").Scan(&s))
		return s
	}(), "the safe order always gets through")
}
