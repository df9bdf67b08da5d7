package main_test

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// TestAHostKilledAfterARouteDeleteLandedLosesNoPropagationWindow: a `takoserver serve` killed
// (SIGKILL) in the middle of an endpoint's DELETE, after Cloudflare took the workers.dev route
// down and while the Host waited for the readback of its absence. Another Host recovers the
// operation on the owner's retry and finishes the delete; the deletion attestation stays open
// for the route's propagation window from that readback (SPEC 3.6: an old edge may still
// route), then closes.
func TestAHostKilledAfterARouteDeleteLandedLosesNoPropagationWindow(t *testing.T) {
	t.Parallel()
	url, key := migratedWithKey(t)
	kek := sealingKey(t)
	s := invariantStandin(t)
	catalog := workersDevCatalog(t, s, 3, nil)
	a := startHost(t, url, kek, "--config", catalog, "--janitor-every", "1s")

	status, w := call(t, http.MethodPut, a.url+"/v1/spaces/prod/workers/api", key, "token-killed-worker-001",
		`{"modules":{"index.js":"export default { fetch() { return new Response(\"x\") } }"},"mainModule":"index.js","compatibilityDate":"2025-01-01","offeringId":"`+offeringWDWorker+`"}`)
	require.Equal(t, http.StatusCreated, status, "%v", w)
	script := w["scriptName"].(string)
	endpoint := "/v1/spaces/prod/worker-endpoints/api"
	status, e := call(t, http.MethodPut, a.url+endpoint, key, "token-killed-endpoint-1", `{"worker":"api","offeringId":"`+offeringWDEndpoint+`"}`)
	require.Equal(t, http.StatusCreated, status, "%v", e)
	uid := e["uid"].(string)
	sc, ok := s.Script(script)
	require.True(t, ok)
	require.True(t, sc.Subdomain.Enabled, "the endpoint enabled the script's route")

	// The delete takes the route down; its readback is held, and the Host is killed meanwhile.
	require.NoError(t, s.Inject(cfstandin.Fault{Kind: cfstandin.FaultHold, Method: http.MethodGet, PathContains: "/scripts/" + script + "/subdomain"}))
	t.Cleanup(s.Release)
	go func() {
		req, err := http.NewRequest(http.MethodDelete, a.url+endpoint, nil)
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Takoform-Ownership-Token", "token-killed-endpoint-1")
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	require.Eventually(t, func() bool { return s.Held() == 1 }, 30*time.Second, 10*time.Millisecond, "the readback reached Cloudflare")
	sc, _ = s.Script(script)
	require.False(t, sc.Subdomain.Enabled, "Cloudflare took the route down before the Host was killed")
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	_ = a.cmd.Wait()
	s.Release()

	db, err := store.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	scalar := func(sql string, args ...any) string {
		var v string
		require.NoError(t, db.QueryRow(context.Background(), sql, args...).Scan(&v))
		return v
	}
	op := scalar(`SELECT operation_id::text FROM worker_endpoints WHERE uid = $1`, uid)
	require.Equal(t, "running", scalar(`SELECT status::text FROM operations WHERE id = $1`, op), "the killed Host's operation")
	require.Equal(t, "open", scalar(`SELECT status::text FROM deletion_attestations WHERE uid = $1`, uid))

	// Another Host, once the killed one's lease ran out by the database's clock: the owner's
	// retry recovers the operation (its readback finds the route gone) and finishes the delete.
	_, err = db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES (interval '2 minutes')
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
	require.NoError(t, err)
	b := startHost(t, url, kek, "--config", catalog, "--janitor-every", "1s")
	status, d := call(t, http.MethodDelete, b.url+endpoint, key, "token-killed-endpoint-1", "")
	require.Equal(t, http.StatusOK, status, "%v", d)
	require.Equal(t, "refused", scalar(`SELECT status::text FROM operations WHERE id = $1`, op), "the killed Host's operation, settled")
	require.Equal(t, "1", scalar(`SELECT count(*)::text FROM deployments WHERE resource_uid = $1 AND status = 'deleted' AND routed_until > db_now()`, uid),
		"the route's propagation window runs from the recovered readback")
	attestation := func() string {
		status, v := call(t, http.MethodGet, b.url+"/v1/deletion-attestations/"+uid, key, "", "")
		require.Equal(t, http.StatusOK, status, "%v", v)
		return v["status"].(string)
	}
	require.Equal(t, "open", attestation(), "the attestation waits for the window")
	for deadline := time.Now().Add(30 * time.Second); attestation() != "closed"; time.Sleep(100 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "the attestation never closed after the window")
	}
	require.False(t, strings.Contains(b.logs.String(), invariantCFToken), "the API token is never logged")
}
