package server_test

import (
	"context"
	"database/sql"
	"net/http"
	"strings"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/vectors"
)

// victimPair is the attack pair of the vectors (SPEC 3.4): two organizations whose workers share
// one v1 script name.
type victimVector struct {
	TenantRef    string `json:"tenantRef"`
	Space        string `json:"space"`
	WorkerName   string `json:"workerName"`
	ScriptName   string `json:"scriptName"`
	ScriptNameV2 string `json:"scriptNameV2"`
}

func victimPair(t *testing.T) (victim, attacker victimVector) {
	t.Helper()
	var all []victimVector
	require.NoError(t, vectors.Load("derived-names.json", &all))
	var pair []victimVector
	for _, v := range all {
		if strings.HasPrefix(v.WorkerName, "victim") {
			pair = append(pair, v)
		}
	}
	require.Len(t, pair, 2)
	require.Equal(t, pair[0].ScriptName, pair[1].ScriptName, "the vectors' pair shares a v1 name")
	if pair[0].WorkerName != "victim" {
		pair[0], pair[1] = pair[1], pair[0]
	}
	return pair[0], pair[1]
}

// tenant is an organization of a test with its own key.
type tenant struct {
	id, name, key string
}

// orgWithID makes an organization with a given id (a vector's tenantRef) and a key for it.
func (h *harness) orgWithID(id, name string) tenant {
	h.t.Helper()
	h.exec(`INSERT INTO organizations (id, name) VALUES ($1, $2)`, id, name)
	key, err := auth.CreateKey(context.Background(), h.db, name, nil)
	require.NoError(h.t, err)
	return tenant{id: id, name: name, key: key.Key}
}

// identityModule answers with its organization's name and its API_KEY by length and digest.
func identityModule(org string) string {
	return strings.Replace(secretModule, `return new Response("len="`, `return new Response("org=`+org+` len="`, 1)
}

// deploySecretWorker reserves, prepares, deploys and routes one worker with a secret for tn.
func (h *harness) deploySecretWorker(tn tenant, space, name, secret string) (worker, endpoint map[string]any) {
	h.t.Helper()
	resID := "res-" + tn.name
	r := h.putReservation(tn.key, resID, "token-res-"+tn.name+"-0001", apiBody(space, name))
	require.Equal(h.t, http.StatusCreated, r.status, "body: %s", r.body)
	p := h.prepareAs(tn.key, tn.id, "op-"+tn.name, "token-prep-"+tn.name+"-001", resID, space, name, map[string]string{"API_KEY": secret})
	require.Equal(h.t, http.StatusCreated, p.reply.status, "body: %s", p.reply.body)
	body := secretWorkerBody(p.reference)
	body["modules"] = map[string]string{"index.js": identityModule(tn.name)}
	w := h.do(req{method: http.MethodPut, path: "/v1/spaces/" + space + "/workers/" + name, key: tn.key, token: "token-wkr-" + tn.name + "-0001", body: body})
	require.Equal(h.t, http.StatusCreated, w.status, "body: %s", w.body)
	e := h.do(req{method: http.MethodPut, path: "/v1/spaces/" + space + "/worker-endpoints/" + name, key: tn.key, token: "token-ept-" + tn.name + "-0001",
		body: map[string]any{"worker": name, "originReservationId": resID}})
	require.Equal(h.t, http.StatusCreated, e.status, "body: %s", e.body)
	return w.json(h.t), e.json(h.t)
}

// readyAgrees checks that a projection's ready is its Ready condition's status, and returns it.
func readyAgrees(t *testing.T, p map[string]any) bool {
	t.Helper()
	conds := p["conditions"].([]any)
	first := conds[0].(map[string]any)
	require.Equal(t, "Ready", first["type"])
	require.Equal(t, first["status"] == "True", p["ready"], "ready disagrees with the Ready condition: %v", p)
	return p["ready"].(bool)
}

// The attack of issue 12 replayed with the vectors' pair: two organizations whose worker names
// share a v1 script name, both workers live on one runtime node. Each hostname answers its own
// worker with its own secret, and ready agrees with the Ready condition everywhere.
func TestTakeoverPairServesEachOrganizationItsOwnWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	v, a := victimPair(t)
	victim := h.orgWithID(v.TenantRef, "victim-org")
	attacker := h.orgWithID(a.TenantRef, "attacker-org")

	vw, ve := h.deploySecretWorker(victim, v.Space, v.WorkerName, "canary-victim-secret-1")
	aw, ae := h.deploySecretWorker(attacker, a.Space, a.WorkerName, "canary-attacker-secret-2")
	require.Equal(t, v.ScriptNameV2, vw["scriptName"])
	require.Equal(t, a.ScriptNameV2, aw["scriptName"])
	require.NotEqual(t, vw["scriptName"], aw["scriptName"])

	answers := func(e map[string]any, org, secret string) {
		t.Helper()
		status, body, _ := h.runtime.Get(t, e["hostname"].(string), "/")
		require.Equal(t, http.StatusOK, status, body)
		require.Equal(t, "org="+org+" "+secretShown(secret), body)
	}
	answers(ve, "victim-org", "canary-victim-secret-1")
	answers(ae, "attacker-org", "canary-attacker-secret-2")
	for _, c := range []struct {
		tn   tenant
		path string
	}{
		{victim, "/v1/spaces/prod/workers/" + v.WorkerName}, {victim, "/v1/spaces/prod/worker-endpoints/" + v.WorkerName},
		{attacker, "/v1/spaces/prod/workers/" + a.WorkerName}, {attacker, "/v1/spaces/prod/worker-endpoints/" + a.WorkerName},
	} {
		got := h.do(req{method: http.MethodGet, path: c.path, key: c.tn.key})
		require.Equal(t, http.StatusOK, got.status, "body: %s", got.body)
		require.True(t, readyAgrees(t, got.json(t)), "%s", c.path)
	}

	// The attacker's worker goes; the victim's hostname keeps answering with the victim's secret.
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodDelete, path: "/v1/spaces/prod/worker-endpoints/" + a.WorkerName, key: attacker.key, token: "token-ept-attacker-org-0001"}).status)
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodDelete, path: "/v1/spaces/prod/workers/" + a.WorkerName, key: attacker.key, token: "token-wkr-attacker-org-0001"}).status)
	answers(ve, "victim-org", "canary-victim-secret-1")
	require.True(t, h.delivered(v.ScriptNameV2))
}

// A script the backend holds for another worker UID is never taken: the Host answers the final
// 409 script_held naming nobody, and keeps nothing of the refused create.
func TestScriptHeldByAnotherWorkerIsRefusedAndLeftAlone(t *testing.T) {
	t.Parallel()
	h := setup(t)
	script := backend.ScriptName(backend.WorkerRef{TenantRef: h.org.ID, Space: "prod", Name: "api"})
	rc := h.runtimeClient()
	ctx := context.Background()
	_, err := rc.PutScript(ctx, script, adminapi.ScriptPut{
		EffectID: "foreign-1", WorkerUID: "foreign-uid", DeploymentID: "foreign-dep", Generation: 1,
		Labels:  adminapi.Labels{Organization: "org_someoneelse", Space: "x", Worker: "y"},
		Modules: map[string]string{"index.js": helloModule}, MainModule: "index.js", CompatibilityDate: "2025-01-01", BundleDigest: "foreign",
	})
	require.NoError(t, err)

	p := h.putWorker("prod", "api", workerToken, workerBody()).problem(t, http.StatusConflict, "script_held")
	require.NotContains(t, p["detail"], "foreign-uid")
	require.NotContains(t, p["detail"], "org_someoneelse")
	require.Zero(t, h.count(`SELECT count(*) FROM workers WHERE status <> 'deleted'`), "a refused create leaves no worker")
	st, err := rc.GetScript(ctx, script)
	require.NoError(t, err)
	require.Equal(t, "foreign-uid", st.WorkerUID, "the holder's script was taken down or taken over")

	// Once the holder is gone, the same request goes through.
	_, err = rc.DeleteScript(ctx, script, "foreign-uid")
	require.NoError(t, err)
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, workerBody()).status)
}

// The holder is this organization's own deleted worker whose delete the janitor has yet to confirm
// (a create that never committed): the refusal is the retryable witness_open, and clears once the
// janitor has taken the old script down.
func TestScriptHeldByOwnUnconfirmedDeleteIsRetryable(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.mustWorker("prod", "api", workerToken)
	// The create never committed: its row reads deleted while its deployment still stands.
	h.exec(`UPDATE workers SET status = 'deleted', deleted_at = now() WHERE uid = $1`, first["uid"])
	h.exec(`DELETE FROM ownership_bindings WHERE kind = 'worker'`)

	r := h.putWorker("prod", "api", "token-worker-0000000002", workerBody())
	p := r.problem(t, http.StatusConflict, "witness_open")
	require.NotEmpty(t, r.header.Get("Retry-After"))
	require.Equal(t, []any{"deployment_live"}, p["unmetFences"])

	h.host.Sweep(context.Background())
	again := h.putWorker("prod", "api", "token-worker-0000000002", workerBody())
	require.Equal(t, http.StatusCreated, again.status, "body: %s", again.body)
	require.NotEqual(t, first["uid"], again.json(t)["uid"])
}

// The index holds the rule whatever the Go code does: two standing workers of one installation
// never share a script name, across organizations.
func TestScriptNameIsUniquePerInstallationAcrossOrganizations(t *testing.T) {
	t.Parallel()
	h := setup(t)
	first := h.mustWorker("prod", "api", workerToken)
	other, otherKey := h.newOrg("other")
	w := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/api", key: otherKey, token: workerToken, body: workerBody()})
	require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	_, err := h.db.Exec(context.Background(), `UPDATE workers SET script_name = $1 WHERE organization_id = $2`, first["scriptName"], other.ID)
	require.True(t, store.IsUniqueViolation(err, "workers_script_key"), "%v", err)
}

// The migration meets live duplicate v1 names (the attack pair): the earliest holder keeps the
// name; the other reads ready:false with reason ScriptNameCollision until it is replaced.
func TestMigrationMarksLaterHoldersOfADuplicateV1Name(t *testing.T) {
	t.Parallel()
	h := setup(t)
	v, a := victimPair(t)
	victim := h.orgWithID(v.TenantRef, "victim-org")
	attacker := h.orgWithID(a.TenantRef, "attacker-org")
	for _, tn := range []struct {
		tenant
		name string
	}{{victim, v.WorkerName}, {attacker, a.WorkerName}} {
		w := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/" + tn.name, key: tn.key, token: workerToken, body: workerBody()})
		require.Equal(t, http.StatusCreated, w.status, "body: %s", w.body)
	}

	h.upgradeFromSharedV1Name(v, victim, attacker)

	got := h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/" + a.WorkerName, key: attacker.key}).json(t)
	require.False(t, readyAgrees(t, got))
	require.Equal(t, "ScriptNameCollision", got["conditions"].([]any)[0].(map[string]any)["reason"])
	kept := h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/" + v.WorkerName, key: victim.key}).json(t)
	require.NotEqual(t, "ScriptNameCollision", kept["conditions"].([]any)[0].(map[string]any)["reason"])
	require.Equal(t, "true", h.status(`SELECT script_collision::text FROM workers WHERE organization_id = $1`, attacker.id))
}

// A takeover made before the upgrade is undone after it: the later holder of the shared v1 name
// (the attacker, whose script the node serves under the victim's name) may not deploy again, the
// janitor takes its script down (conditionally on its worker UID), and the victim's next update
// deploys the victim's code there again.
func TestATakeoverFromBeforeTheUpgradeIsUndone(t *testing.T) {
	t.Parallel()
	h := setup(t)
	v, a := victimPair(t)
	victim := h.orgWithID(v.TenantRef, "victim-org")
	attacker := h.orgWithID(a.TenantRef, "attacker-org")
	put := func(tn tenant, name, token string, body map[string]any) reply {
		return h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/" + name, key: tn.key, token: token, body: body})
	}
	victimBody, attackerBody := workerBody(), workerBody()
	victimBody["modules"] = map[string]string{"index.js": `export default { async fetch() { return new Response("victim") } }`}
	attackerBody["modules"] = map[string]string{"index.js": `export default { async fetch() { return new Response("attacker") } }`}
	require.Equal(t, http.StatusCreated, put(victim, v.WorkerName, workerToken, victimBody).status)
	aw := put(attacker, a.WorkerName, workerToken, attackerBody)
	require.Equal(t, http.StatusCreated, aw.status)

	// The state before the upgrade: both under the v1 name, and the node holding it for the
	// attacker (the old node gave a name to the higher deployment number).
	h.upgradeFromSharedV1Name(v, victim, attacker)
	var err error
	var attackerDeployment string
	var attackerSeq int64
	require.NoError(t, h.db.QueryRow(context.Background(), `SELECT d.id::text, d.seq FROM deployments d JOIN workers w ON w.uid = d.resource_uid
		WHERE w.organization_id = $1 AND d.status = 'active'`, attacker.id).Scan(&attackerDeployment, &attackerSeq))
	rc := h.runtimeClient()
	ctx := context.Background()
	_, err = rc.PutScript(ctx, v.ScriptName, adminapi.ScriptPut{
		EffectID: "takeover-1", WorkerUID: aw.json(t)["uid"].(string), DeploymentID: attackerDeployment, Generation: attackerSeq,
		Labels:  adminapi.Labels{Organization: "attacker-org", Space: "prod", Worker: a.WorkerName},
		Modules: attackerBody["modules"].(map[string]string), MainModule: "index.js", CompatibilityDate: "2025-01-01", BundleDigest: "attacker",
	})
	require.NoError(t, err)

	// The attacker's worker can no longer write the name.
	attackerBody["modules"] = map[string]string{"index.js": `export default { async fetch() { return new Response("attacker v2") } }`}
	h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/" + a.WorkerName, key: attacker.key, token: workerToken, body: attackerBody}).
		problem(t, http.StatusConflict, "script_held")

	// The janitor takes the attacker's script down, and its node reconciler writes the victim's
	// current deployment back under the name; the victim's next update deploys as usual.
	h.host.Sweep(ctx)
	st, err := rc.GetScript(ctx, v.ScriptName)
	require.NoError(t, err)
	require.Equal(t, h.status(`SELECT uid::text FROM workers WHERE organization_id = $1`, victim.id), st.WorkerUID,
		"the attacker's script is still on the node: %+v", st)
	victimBody["modules"] = map[string]string{"index.js": `export default { async fetch() { return new Response("victim v2") } }`}
	again := put(victim, v.WorkerName, workerToken, victimBody)
	require.Equal(t, http.StatusOK, again.status, "body: %s", again.body)
	require.True(t, readyAgrees(t, again.json(t)))
	st, err = rc.GetScript(ctx, v.ScriptName)
	require.NoError(t, err)
	require.Equal(t, again.json(t)["uid"], st.WorkerUID)
	require.True(t, st.Ready)
}

// upgradeFromSharedV1Name puts both organizations' workers (and their deployments) under the pair's
// shared v1 script name on the schema before script names were unique (the victim's the earlier),
// and migrates up again: the state an upgrade meets after the attack.
func (h *harness) upgradeFromSharedV1Name(v victimVector, victim, attacker tenant) {
	h.t.Helper()
	db, err := sql.Open("pgx", h.dbURL)
	require.NoError(h.t, err)
	defer db.Close()
	m, err := store.Migrator(db)
	require.NoError(h.t, err)
	defer m.Close()
	require.NoError(h.t, m.Migrate(4))
	h.exec(`UPDATE workers SET script_name = $1, created_at = now() - interval '1 day' WHERE organization_id = $2`, v.ScriptName, victim.id)
	h.exec(`UPDATE workers SET script_name = $1 WHERE organization_id = $2`, v.ScriptName, attacker.id)
	h.exec(`UPDATE deployments SET native_name = $1 WHERE resource_kind = 'worker'`, v.ScriptName)
	require.NoError(h.t, m.Up())
	// Migrating down and up made the enum types and views again: the Host's connections hold
	// statements prepared on the old ones, which a restarted Host would not.
	h.db.Reset()
}
