package runtime_test

import (
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// TestEveryRefusalOfDesiredApplyIsTheSameProblemOnTheWire: the handlers turn each refusal of
// desired.Apply into its problem in one place. Each keeps its status, title and code, carries the
// current status only where the refusal allows it (never where the holder may be another
// organization's), and names nobody; a replay answers 200 marked replayed.
func TestEveryRefusalOfDesiredApplyIsTheSameProblemOnTheWire(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	f.script("app", "uid-a", 5, "a", "TOKEN")
	f.route("app.workers.localhost", "app", "ep-a")
	challenge := make([]byte, 32)
	_, _ = rand.Read(challenge)
	_, err := f.client.Readback(f.ctx, "app", challenge, "d-late")
	require.NoError(t, err)

	put := f.scriptPut("uid-a", 6, "b", "TOKEN")
	code, _ := f.raw(http.MethodPut, adminapi.ScriptPath("app"), f.token(), put)
	require.Equal(t, http.StatusOK, code)
	reused := put
	reused.DeploymentID = "dep-other"
	attack := f.scriptPut("uid-x", 1_000_000, "x", "TOKEN")
	attack.Labels.Organization = "org-9"
	secrets := func(uid, delivery, name string) adminapi.SecretsPut {
		return adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: uid, DeliveryID: delivery, Values: map[string]vocab.Secret{name: vocab.NewSecret("v")}}
	}

	for _, tc := range []struct {
		code, path string
		body       any
		status     int
		title      string
		current    bool
		omits      []string
	}{
		{adminapi.CodeEffectConflict, adminapi.ScriptPath("app"), reused, http.StatusConflict, "Conflict", false, nil},
		{adminapi.CodeStaleGeneration, adminapi.ScriptPath("app"), f.scriptPut("uid-a", 4, "old", "TOKEN"), http.StatusConflict, "Conflict", true, nil},
		{adminapi.CodeGenerationConflict, adminapi.ScriptPath("app"), f.scriptPut("uid-a", 6, "other", "TOKEN"), http.StatusConflict, "Conflict", true, nil},
		{adminapi.CodeScriptHeld, adminapi.ScriptPath("app"), attack, http.StatusConflict, "Script held", false, []string{"uid-a", "org-1"}},
		{adminapi.CodeDeliveryRefused, adminapi.SecretsPath("app"), secrets("uid-a", "d-late", "TOKEN"), http.StatusConflict, "Delivery refused", false, nil},
		{adminapi.CodeScriptAbsent, adminapi.SecretsPath("absent"), secrets("uid-a", "d-1", "TOKEN"), http.StatusNotFound, "Not Found", false, nil},
		{adminapi.CodeWorkerMismatch, adminapi.SecretsPath("app"), secrets("uid-x", "d-1", "TOKEN"), http.StatusConflict, "Worker mismatch", false, []string{"uid-a", "org-1"}},
		{adminapi.CodeSecretNames, adminapi.SecretsPath("app"), secrets("uid-a", "d-1", "OTHER"), http.StatusUnprocessableEntity, "Secret names mismatch", false, nil},
		{adminapi.CodeRouteConflict, adminapi.RoutePath("app.workers.localhost"),
			adminapi.RoutePut{EffectID: f.effect(), ScriptName: "app", EndpointUID: "ep-b", DeploymentID: "dep-b"}, http.StatusConflict, "Conflict", true, nil},
	} {
		status, body := f.raw(http.MethodPut, tc.path, f.token(), tc.body)
		var p map[string]any
		require.NoError(t, json.Unmarshal([]byte(body), &p), body)
		require.Equal(t, tc.status, status, "%s: %s", tc.code, body)
		require.Equal(t, tc.code, p["code"], body)
		require.Equal(t, tc.title, p["title"], body)
		require.Equal(t, tc.current, p["current"] != nil, "%s: whether the current status is shown: %s", tc.code, body)
		for _, w := range tc.omits {
			require.NotContains(t, body, w, "%s names nobody", tc.code)
		}
	}

	req, err := http.NewRequest(http.MethodPut, f.h.Info.AdminURL+adminapi.ScriptPath("app"), strings.NewReader(mustJSON(t, put)))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+f.token())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "true", resp.Header.Get(adminapi.HeaderReplayed))
}
