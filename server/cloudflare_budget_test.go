package server_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/ratebudget"
)

// TestRuleOneOrganizationCannotDrainAnothersCloudflareBudget (issue 32 item 11): the calls a
// request makes to Cloudflare take from its organization's share of the installation's budget as
// well as from the installation's. One organization reading its worker in a loop (forty reads at
// once, against a budget of 24 calls refilling at one every two seconds) slows only itself:
// another organization's read on the same installation answers at once, Ready.
func TestRuleOneOrganizationCannotDrainAnothersCloudflareBudget(t *testing.T) {
	t.Parallel()
	c := setupCFScripts(t, cfScriptsOptions{budget: ratebudget.Budget{Capacity: 24, PerSecond: 0.5, Share: 0.5}})
	const code = "export default { fetch() { return new Response('ok') } };"
	r := c.putWorker("prod", "api", tokenA, cfWorkerBody(code))
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	_, otherKey := c.newOrg("globex")
	r = c.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/api", key: otherKey, token: tokenA, body: cfWorkerBody(code)})
	require.Equal(t, http.StatusCreated, r.status, "body: %s", r.body)
	c.pass(time.Minute) // both buckets full again

	var loop sync.WaitGroup
	for range 40 {
		loop.Add(1)
		go func() {
			defer loop.Done()
			_, _ = c.try(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: c.key})
		}()
	}
	time.Sleep(time.Second) // acme's share is spent; its other reads wait on it
	start := time.Now()
	got := c.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: otherKey})
	took := time.Since(start)
	require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
	require.Equal(t, true, got.json(t)["ready"], "globex's worker reads Ready: %s", got.body)
	require.Less(t, took, 3*time.Second, "globex's read waited on acme's loop")
	loop.Wait()
}
