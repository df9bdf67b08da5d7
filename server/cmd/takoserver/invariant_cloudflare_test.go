package main_test

import (
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// The sequences run with a workers-dev installation beside the selfhost one: each sequence places
// every worker name on one of the two (consistently: its worker, its reservations and its endpoint
// all name that installation's offerings), and the custody checks read the Cloudflare stand-in's
// scripts too.

const (
	invariantCFAccount   = "0123456789abcdef0123456789abcdef"
	invariantCFSubdomain = "acme"
	invariantCFToken     = "cf-invariant-canary-token-7a11"

	offeringLocalWorker   = "selfhost-module-worker"
	offeringLocalEndpoint = "selfhost-worker-endpoint"
	offeringWDWorker      = "wd-worker"
	offeringWDEndpoint    = "wd-endpoint"
)

// invariantStandin starts a Cloudflare stand-in (with workerd) for one sequence.
func invariantStandin(t *testing.T) *cfstandin.Server {
	t.Helper()
	s, err := cfstandin.New(cfstandin.Config{Token: invariantCFToken, AccountID: invariantCFAccount,
		AccountSubdomain: invariantCFSubdomain, Workerd: workerdtest.Binary(t)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// invariantCatalog writes a catalog selling the selfhost installation that drives n (reached
// through adminURL), with the installation's fields extra, and a workers-dev one on s.
func invariantCatalog(t *testing.T, n node, adminURL string, s *cfstandin.Server, extra map[string]any) string {
	t.Helper()
	local := map[string]any{"name": "selfhost", "pack": "selfhost", "runtimeUrl": adminURL, "runtimeTokenFile": n.tokenFile, "edgeListen": n.edgeAddr}
	maps.Copy(local, extra)
	if n.poolPublicKey != "" {
		local["poolPublicKey"] = n.poolPublicKey
	}
	return workersDevCatalog(t, s, 2, local,
		map[string]any{"id": offeringLocalWorker, "kind": "module-worker", "installation": "selfhost", "soldTo": []string{"*"}},
		map[string]any{"id": offeringLocalEndpoint, "kind": "worker-endpoint", "installation": "selfhost", "soldTo": []string{"*"}})
}

// workersDevCatalog writes a catalog selling a workers-dev installation "wd" on s (its token file
// 0600 in a 0700 directory, the route propagation window propagation seconds) and, when given,
// another installation and its offerings.
func workersDevCatalog(t *testing.T, s *cfstandin.Server, propagation int, other map[string]any, otherOfferings ...map[string]any) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "conf")
	require.NoError(t, safedir.Ensure(dir, safedir.Current()))
	require.NoError(t, safedir.WriteFile(dir, "cf-token", []byte(invariantCFToken+"\n"), safedir.Current()))
	installations := []any{map[string]any{"name": "wd", "pack": "workers-dev", "accountSubdomain": invariantCFSubdomain, "accountId": invariantCFAccount,
		"apiTokenFile": filepath.Join(dir, "cf-token"), "apiBaseUrl": s.BaseURL(), "routePropagationSeconds": propagation}}
	offerings := []any{
		map[string]any{"id": offeringWDWorker, "kind": "module-worker", "installation": "wd", "soldTo": []string{"*"}},
		map[string]any{"id": offeringWDEndpoint, "kind": "worker-endpoint", "installation": "wd", "soldTo": []string{"*"}},
	}
	if other != nil {
		installations = append([]any{other}, installations...)
	}
	for i, o := range otherOfferings {
		offerings = slices.Insert(offerings, i, any(o))
	}
	body, err := json.Marshal(map[string]any{"installations": installations, "offerings": offerings})
	require.NoError(t, err)
	path := filepath.Join(dir, "catalog.json")
	require.NoError(t, os.WriteFile(path, body, 0o600))
	return path
}

// placeWorkers puts half of the sequence's worker names (picked at random) on workers-dev, the
// other half on selfhost; a pooled sequence (pool) puts them all on its pool.
func (w *world) placeWorkers(pool bool) {
	w.onWD = map[string]bool{}
	if pool {
		w.t.Logf("every worker on the selfhost pool")
		return
	}
	// A generator of its own, so that the sequence's own draws stay what its seed made them.
	place := rand.New(rand.NewPCG(w.seed^0x5bd1e995, w.seed))
	for _, i := range place.Perm(len(invariantWorkerNames))[:len(invariantWorkerNames)/2] {
		w.onWD[invariantWorkerNames[i]] = true
	}
	var wd []string
	for _, name := range invariantWorkerNames {
		if w.onWD[name] {
			wd = append(wd, name)
		}
	}
	w.t.Logf("on workers-dev: %v; the others on selfhost", wd)
}

// withOffering names, in a PUT's body, the offering of the installation the worker the request is
// about was placed on; other requests pass unchanged.
func (w *world) withOffering(method, path, body string) string {
	if method != http.MethodPut || body == "" {
		return body
	}
	var b map[string]any
	if json.Unmarshal([]byte(body), &b) != nil {
		return body
	}
	parts := strings.Split(strings.TrimPrefix(path, "/v1/"), "/")
	worker, endpoint := "", false
	switch {
	case len(parts) == 4 && parts[2] == "workers":
		worker = parts[3]
	case len(parts) == 4 && parts[2] == "worker-endpoints":
		worker, _ = b["worker"].(string)
		endpoint = true
	case len(parts) == 2 && parts[0] == "worker-endpoint-origin-reservations":
		worker, _ = b["workerName"].(string) // a reservation names its worker's offering
	default:
		return body
	}
	wd := w.onWD[worker]
	switch {
	case endpoint && wd:
		b["offeringId"] = offeringWDEndpoint
	case endpoint:
		b["offeringId"] = offeringLocalEndpoint
	case wd:
		b["offeringId"] = offeringWDWorker
	default:
		b["offeringId"] = offeringLocalWorker
	}
	raw, err := json.Marshal(b)
	if err != nil {
		return body
	}
	return string(raw)
}

// noteWD counts the workers-dev share of endpoint creates.
func (w *world) noteWD(method, path string, a answer) {
	parts := strings.Split(strings.TrimPrefix(path, "/v1/"), "/")
	if method != http.MethodPut || len(parts) != 4 || parts[2] != "worker-endpoints" || a.status != http.StatusCreated {
		return
	}
	var e map[string]any
	if json.Unmarshal([]byte(a.body), &e) == nil && e["offeringId"] == offeringWDEndpoint {
		w.progress.wdEndpointCreated++
	}
}

// checkStandin states script custody on the Cloudflare stand-in: every script carries the UID of a
// worker of that script name; a live worker's script carries its own UID; no script is left for a
// worker whose delete committed; and a workers-dev worker the API reads Ready is served by a
// script holding its UID.
func (w *world) checkStandin() {
	w.t.Helper()
	ctx := context.Background()
	held := map[string]string{} // script name -> TAKOFORM_WORKER_UID on the stand-in
	for _, name := range w.standin.ScriptNames("") {
		sc, ok := w.standin.Script(name)
		if !ok {
			continue // deleted since it was listed
		}
		b, ok := sc.Current.Binding(cloudflare.BindingWorkerUID)
		if !ok {
			w.fail("the stand-in holds script %s without a %s binding", name, cloudflare.BindingWorkerUID)
		}
		held[name] = b.Text
		var status, script string
		err := w.db.QueryRow(ctx, `SELECT status, script_name FROM workers WHERE uid = $1::uuid`, b.Text).Scan(&status, &script)
		switch {
		case err == pgx.ErrNoRows:
			continue // a create whose row never committed: recovery's to delete
		case err != nil:
			require.NoError(w.t, err)
		case script != name:
			w.fail("the stand-in's script %s carries the UID %s of worker script %s", name, b.Text, script)
		case status == "deleted" && !w.lateWriteInCustody(ctx, name, b.Text):
			w.fail("the stand-in still holds script %s of worker %s, whose delete committed", name, b.Text)
		}
	}
	if w.progress.wdScriptsSeen < len(held) {
		w.progress.wdScriptsSeen = len(held)
	}
	w.checkHeldScriptsAreLiveWorkers(ctx, "stand-in", held)
	for _, org := range w.orgs {
		for _, name := range invariantWorkerNames {
			a, err := w.send(w.hosts[len(w.hosts)-1], org, http.MethodGet, workerPath(name), "", "")
			require.NoError(w.t, err)
			if a.status != http.StatusOK {
				continue
			}
			var wk map[string]any
			require.NoError(w.t, json.Unmarshal([]byte(a.body), &wk))
			if wk["offeringId"] != offeringWDWorker {
				continue
			}
			if ready, _ := wk["ready"].(bool); ready && held[wk["scriptName"].(string)] != wk["uid"] {
				w.fail("workers-dev worker %s of %s reads Ready while the stand-in holds its script %s for %q", name, org.name, wk["scriptName"], held[wk["scriptName"].(string)])
			}
		}
	}
}

// lateWriteInCustody reports whether script (of worker uid, which no longer stands) is in the
// custody of a pending late-write re-check: an upload of a killed Host (or one that got no answer)
// that landed after its apply was read back absent. One not due yet may stand; one due is given
// the janitors (every 2 s) a few seconds, after which the script must be gone.
func (w *world) lateWriteInCustody(ctx context.Context, script, uid string) bool {
	w.t.Helper()
	var due bool
	err := w.db.QueryRow(ctx, `SELECT bool_or(due_at <= db_now()) FROM late_write_rechecks
		WHERE worker_uid = $1::uuid AND script_name = $2 AND status = 'pending' HAVING count(*) > 0`, uid, script).Scan(&due)
	if err == pgx.ErrNoRows {
		return false
	}
	require.NoError(w.t, err)
	w.progress.lateWrites++
	if !due {
		return true
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		sc, ok := w.standin.Script(script)
		if !ok {
			return true
		}
		if b, _ := sc.Current.Binding(cloudflare.BindingWorkerUID); b.Text != uid {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// settleLateWrites moves the database's clock past every pending late-write re-check, waits for
// the janitors to settle them, and checks the stand-in once more: no late script outlives it.
func (w *world) settleLateWrites() {
	w.t.Helper()
	ctx := context.Background()
	_, err := w.db.Exec(ctx, `INSERT INTO clock_skew (skew) VALUES (interval '2 minutes')
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
	require.NoError(w.t, err)
	require.Eventually(w.t, func() bool {
		var n int
		err := w.db.QueryRow(ctx, `SELECT count(*) FROM late_write_rechecks WHERE status = 'pending'`).Scan(&n)
		return err == nil && n == 0
	}, 30*time.Second, 50*time.Millisecond, "the janitors settle every late-write re-check")
	require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE status = 'removed') FROM late_write_rechecks`).Scan(&w.progress.rechecks, &w.progress.lateRemoved))
	w.check()
}
