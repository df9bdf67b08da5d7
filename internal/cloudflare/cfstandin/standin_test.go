package cfstandin_test

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
)

// The SDK-driven tests (internal/backend/cloudflare) cover the routes; these cover what the SDK
// never sends: missing credentials, another account, unknown routes, and the admin routes.

const (
	token   = "standin-token-abc"
	account = "acct0001"
)

func newStandin(t *testing.T) *cfstandin.Server {
	t.Helper()
	s, err := cfstandin.New(cfstandin.Config{Token: token, AccountID: account, AccountSubdomain: "acme", KVNamespaces: []string{"kv1"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

type envelope struct {
	Success bool `json:"success"`
	Errors  []struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
	Messages []any          `json:"messages"`
	Result   map[string]any `json:"result"`
}

func call(t *testing.T, s *cfstandin.Server, method, path, auth, body string) (int, envelope, string) {
	t.Helper()
	req, err := http.NewRequest(method, strings.TrimSuffix(s.BaseURL(), "/client/v4/")+path, strings.NewReader(body))
	require.NoError(t, err)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	raw, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	var env envelope
	require.NoError(t, json.Unmarshal(raw, &env), string(raw))
	return res.StatusCode, env, string(raw)
}

func TestAuthenticationAnswersCloudflaresCodes(t *testing.T) {
	t.Parallel()
	s := newStandin(t)
	path := "/client/v4/accounts/" + account + "/workers/subdomain"
	for _, tc := range []struct {
		name, auth, path string
		status, code     int
	}{
		{"no credentials", "", path, http.StatusBadRequest, cfstandin.CodeMissingCredentials},
		{"unknown token", "Bearer nope", path, http.StatusForbidden, cfstandin.CodeInvalidToken},
		{"not a bearer token", token, path, http.StatusForbidden, cfstandin.CodeInvalidToken},
		{"another account", "Bearer " + token, "/client/v4/accounts/other/workers/subdomain", http.StatusForbidden, cfstandin.CodeAuthentication},
		{"unknown route", "Bearer " + token, "/client/v4/accounts/" + account + "/nothing", http.StatusNotFound, cfstandin.CodeNoRoute},
	} {
		status, env, raw := call(t, s, http.MethodGet, tc.path, tc.auth, "")
		require.Equal(t, tc.status, status, tc.name)
		require.False(t, env.Success, tc.name)
		require.NotNil(t, env.Messages, "%s: messages is always present: %s", tc.name, raw)
		require.Len(t, env.Errors, 1, tc.name)
		require.Equal(t, tc.code, env.Errors[0].Code, tc.name)
		require.NotContains(t, raw, token, tc.name)
	}
	status, env, _ := call(t, s, http.MethodGet, path, "Bearer "+token, "")
	require.Equal(t, http.StatusOK, status)
	require.True(t, env.Success)
	require.Equal(t, "acme", env.Result["subdomain"])
}

func TestAdminRoutesArmFaultsAndShowStateWithoutSecretValues(t *testing.T) {
	t.Parallel()
	s := newStandin(t)
	bearer := "Bearer " + token
	status, _, _ := call(t, s, http.MethodPost, "/__standin/faults", "Bearer nope", `{"kind":"server_error"}`)
	require.Equal(t, http.StatusForbidden, status)
	status, _, raw := call(t, s, http.MethodPost, "/__standin/faults", bearer, `{"kind":"server_error","status":503,"pathContains":"/workers/subdomain"}`)
	require.Equal(t, http.StatusOK, status, raw)
	status, env, _ := call(t, s, http.MethodGet, "/client/v4/accounts/"+account+"/workers/subdomain", bearer, "")
	require.Equal(t, http.StatusServiceUnavailable, status)
	require.Equal(t, cfstandin.CodeInternal, env.Errors[0].Code)
	status, _, _ = call(t, s, http.MethodGet, "/client/v4/accounts/"+account+"/workers/subdomain", bearer, "")
	require.Equal(t, http.StatusOK, status, "the fault met one request")

	status, _, raw = call(t, s, http.MethodPost, "/__standin/faults", bearer, `{"kind":"explode"}`)
	require.Equal(t, http.StatusBadRequest, status, raw)

	status, _, _ = call(t, s, http.MethodPost, "/__standin/block", bearer, `{"seconds":120}`)
	require.Equal(t, http.StatusOK, status)
	req, _ := http.NewRequest(http.MethodGet, s.BaseURL()+"accounts/"+account+"/workers/subdomain", nil)
	req.Header.Set("Authorization", bearer)
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusTooManyRequests, res.StatusCode)
	require.Equal(t, "120", res.Header.Get("Retry-After"))

	s.Block(time.Nanosecond) // end the block (it is measured from now)
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	meta, _ := mw.CreateFormField("metadata")
	_, _ = meta.Write([]byte(`{"main_module":"w.js","compatibility_date":"2024-09-23","bindings":[{"type":"secret_text","name":"K","text":"hunter2-secret"}]}`))
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", `form-data; name="files"; filename="w.js"`)
	h.Set("Content-Type", "application/javascript+module")
	part, _ := mw.CreatePart(h)
	_, _ = part.Write([]byte("export default { fetch() { return new Response('x') } }"))
	_ = mw.Close()
	req, _ = http.NewRequest(http.MethodPut, s.BaseURL()+"accounts/"+account+"/workers/scripts/w", &body)
	req.Header.Set("Authorization", bearer)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	res, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	_ = res.Body.Close()
	require.Equal(t, http.StatusOK, res.StatusCode)
	sc, ok := s.Script("w")
	require.True(t, ok)
	k, _ := sc.Current.Binding("K")
	require.Equal(t, "hunter2-secret", k.Text, "tests in-process see the value")

	status, env, raw = call(t, s, http.MethodGet, "/__standin/state", bearer, "")
	require.Equal(t, http.StatusOK, status, raw)
	require.Equal(t, account, env.Result["account_id"])
	require.Contains(t, raw, `"name":"K"`)
	require.NotContains(t, raw, "hunter2-secret", "the admin state shows no secret value")
}
