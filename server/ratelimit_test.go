package server_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateLimitRefusesAKeyOverItsRateWithRetryAfter: past its burst a key gets 429 rate_limited
// with Retry-After, another key of the same organization does not, and after Retry-After the key
// is served again. The refusals conform to the API document.
func TestRateLimitRefusesAKeyOverItsRateWithRetryAfter(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog("", `{"perKeyPerSecond": 0.5, "perKeyBurst": 3}`))
	v := newConformance(t)
	for range 3 {
		require.Equal(t, http.StatusOK, v.raw(t, http.MethodGet, h.url+"/v1/capabilities", h.key, nil, ""))
	}
	r := h.get("/v1/capabilities")
	p := r.problem(t, http.StatusTooManyRequests, "rate_limited")
	require.Contains(t, p["detail"], "0.5 requests a second (burst 3)")
	wait, err := strconv.Atoi(r.header.Get("Retry-After"))
	require.NoError(t, err)
	require.InDelta(t, 2, wait, 1, "a token comes back every 2 s")
	require.Equal(t, http.StatusTooManyRequests, v.raw(t, http.MethodPut, h.url+resPath+"res-a", h.key,
		map[string]string{"Takoform-Ownership-Token": tokenA, "Content-Type": "application/json"}, `{"space":"prod","workerName":"a"}`))
	require.Zero(t, h.rowCount("true"), "a refused request changes nothing")

	other := h.keyWith(h.org.Name).Key
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: "/v1/capabilities", key: other}).status, "each key has its own bucket")

	time.Sleep(time.Duration(wait) * time.Second)
	require.Equal(t, http.StatusOK, h.get("/v1/capabilities").status, "served again after Retry-After")
}

// TestRateLimitNeverRefusesAKeyUnderItsRate: a key that keeps under its rate is never refused,
// however long it goes on.
func TestRateLimitNeverRefusesAKeyUnderItsRate(t *testing.T) {
	t.Parallel()
	h := setup(t, quotaCatalog("", `{"perKeyPerSecond": 20, "perKeyBurst": 2}`))
	// 5 a second, a quarter of the rate: on a loaded machine requests bunch up (a late tick is
	// followed at once by the next), and the margin keeps bunching from reading as a key over its
	// rate.
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for i := range 20 {
		<-tick.C
		r := h.get("/v1/capabilities")
		require.Equal(t, http.StatusOK, r.status, "request %d: %s", i, r.body)
	}
}
