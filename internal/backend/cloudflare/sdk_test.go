package cloudflare_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"
	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// These tests drive the Cloudflare stand-in through the official SDK, so that what reaches the
// stand-in is the SDK's own request encoding, and so that the SDK discipline (explicit options,
// no retries of its own) is proven against something that answers like Cloudflare.

const (
	account    = "0123456789abcdef0123456789abcdef"
	subdomain  = "acme"
	baseDomain = "apps.example.test"
	routingKV  = "kv-routing"
	dispatchNS = "takoform-tenants"
	token      = "cf-test-token-0123456789"
)

// echoWorker answers with its bindings, so a fetch through the edge shows what the upload
// delivered. The marker tells versions apart.
func echoWorker(marker string) []byte {
	return []byte(`export default {
  async fetch(request, env) {
    return Response.json({ marker: "` + marker + `", greeting: env.GREETING ?? null, apiKey: env.API_KEY ?? null,
      uid: env.TAKOFORM_WORKER_UID ?? null, host: new URL(request.url).hostname });
  },
};
`)
}

type answer struct {
	Marker   string  `json:"marker"`
	Greeting *string `json:"greeting"`
	APIKey   *string `json:"apiKey"`
	UID      *string `json:"uid"`
}

// clock is the stand-in's time, moved by tests past stale windows and rate blocks.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *clock) Advance(d time.Duration) { c.mu.Lock(); defer c.mu.Unlock(); c.t = c.t.Add(d) }

type fixture struct {
	standin *cfstandin.Server
	sdk     *cloudflare.Services
	clock   *clock
}

func setup(t *testing.T, tweak func(*cfstandin.Config)) fixture {
	t.Helper()
	clk := &clock{t: time.Now()}
	cfg := cfstandin.Config{
		Token: token, AccountID: account, AccountSubdomain: subdomain,
		DispatchNamespaces: []string{dispatchNS}, KVNamespaces: []string{routingKV},
		BaseDomain: baseDomain, RoutingKVNamespace: routingKV, RoutingDispatchNamespace: dispatchNS,
		KVStale: 60 * time.Second, Workerd: workerdtest.Binary(t), Now: clk.Now,
	}
	if tweak != nil {
		tweak(&cfg)
	}
	s, err := cfstandin.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: s.BaseURL(), Token: vocab.NewSecret(token)})
	require.NoError(t, err)
	return fixture{standin: s, sdk: sdk, clock: clk}
}

// params returns SDK parameters of type P with only the account set (the SDK keeps its field
// type internal, so tests set it by name).
func params[P any]() P {
	var p P
	f := reflect.ValueOf(&p).Elem().FieldByName("AccountID")
	f.FieldByName("Value").SetString(account)
	f.FieldByName("Present").SetBool(true)
	return p
}

func apiError(t *testing.T, err error) *cloudflare.APIError {
	t.Helper()
	require.Error(t, err)
	e, ok := cloudflare.AsAPIError(err)
	require.Truef(t, ok, "not an answer of the API: %v", err)
	return e
}

func fetch(t *testing.T, f fixture, url string, header http.Header) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := f.standin.EdgeClient().Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return res.StatusCode, body
}

func fetchAnswer(t *testing.T, f fixture, url string) answer {
	t.Helper()
	status, body := fetch(t, f, url, nil)
	require.Equalf(t, http.StatusOK, status, "%s: %s", url, body)
	var a answer
	require.NoError(t, json.Unmarshal(body, &a), string(body))
	return a
}

func firstUpload(marker string) cloudflare.Upload {
	return cloudflare.Upload{
		MainModule: "worker.js", CompatibilityDate: "2024-09-23",
		Modules:   []cloudflare.Module{{Name: "worker.js", Content: echoWorker(marker)}},
		PlainText: map[string]string{"GREETING": "hello", "TAKOFORM_WORKER_UID": "uid-1"},
		Secrets:   map[string]vocab.Secret{"API_KEY": vocab.NewSecret("s3cr3t-value")},
	}
}

func enableSubdomain(t *testing.T, f fixture, script string, enabled bool) *workers.ScriptSubdomainNewResponse {
	t.Helper()
	p := params[workers.ScriptSubdomainNewParams]()
	p.Enabled.Value, p.Enabled.Present = enabled, true
	p.PreviewsEnabled.Value, p.PreviewsEnabled.Present = false, true
	res, err := f.sdk.Scripts.Subdomain.New(context.Background(), script, p)
	require.NoError(t, err)
	return res
}

func TestUploadedModuleWorkerServesItsSecretAndPlainTextAtItsWorkersDevURL(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()

	res, err := f.sdk.Scripts.Update(ctx, "tsw-one", firstUpload("v1").ScriptParams(account))
	require.NoError(t, err)
	require.Equal(t, "tsw-one", res.ID)
	require.True(t, res.HasModules)

	// The SDK's multipart encoding reached the stand-in whole: modules, main module, bindings.
	sc, ok := f.standin.Script("tsw-one")
	require.True(t, ok)
	require.Equal(t, "worker.js", sc.Current.MainModule)
	require.Equal(t, "application/javascript+module", sc.Current.Modules[0].ContentType)
	secret, ok := sc.Current.Binding("API_KEY")
	require.True(t, ok)
	require.Equal(t, "secret_text", secret.Type)

	// Not on workers.dev until its route is enabled.
	url := "https://tsw-one." + subdomain + ".workers.dev/"
	status, _ := fetch(t, f, url, nil)
	require.Equal(t, http.StatusNotFound, status)

	sub := enableSubdomain(t, f, "tsw-one", true)
	require.True(t, sub.Enabled)
	require.False(t, sub.PreviewsEnabled)

	a := fetchAnswer(t, f, url)
	require.Equal(t, "v1", a.Marker)
	require.Equal(t, "hello", *a.Greeting)
	require.Equal(t, "s3cr3t-value", *a.APIKey)
	require.Equal(t, "uid-1", *a.UID)

	acct, err := f.sdk.Subdomains.Get(ctx, params[workers.SubdomainGetParams]())
	require.NoError(t, err)
	require.Equal(t, subdomain, acct.Subdomain)
}

func TestCodeChangeWithInheritKeepsTheSecretAndSettingsReadbackIsValueFree(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	_, err := f.sdk.Scripts.Update(ctx, "tsw-two", firstUpload("v1").ScriptParams(account))
	require.NoError(t, err)
	enableSubdomain(t, f, "tsw-two", true)

	change := firstUpload("v2")
	change.Secrets = nil
	change.Inherit = []string{"API_KEY"}
	change.StrictInherit = true
	_, err = f.sdk.Scripts.Update(ctx, "tsw-two", change.ScriptParams(account))
	require.NoError(t, err)

	a := fetchAnswer(t, f, "https://tsw-two."+subdomain+".workers.dev/")
	require.Equal(t, "v2", a.Marker, "the new code runs")
	require.NotNil(t, a.APIKey)
	require.Equal(t, "s3cr3t-value", *a.APIKey, "the inherited secret was kept without being resent")

	settings, err := f.sdk.Scripts.ScriptAndVersionSettings.Get(ctx, "tsw-two", params[workers.ScriptScriptAndVersionSettingGetParams]())
	require.NoError(t, err)
	require.NotContains(t, settings.JSON.RawJSON(), "s3cr3t-value", "settings readback shows no secret value")
	types := map[string]string{}
	for _, b := range settings.Bindings {
		types[b.Name] = string(b.Type)
		if b.Name == "GREETING" {
			require.Equal(t, "hello", b.Text, "plain text is shown")
		}
	}
	require.Equal(t, map[string]string{"API_KEY": "secret_text", "GREETING": "plain_text", "TAKOFORM_WORKER_UID": "plain_text"}, types)

	secrets, err := f.sdk.Scripts.Secrets.List(ctx, "tsw-two", params[workers.ScriptSecretListParams]())
	require.NoError(t, err)
	require.Len(t, secrets.Result, 1)
	require.Equal(t, "API_KEY", secrets.Result[0].Name)

	// Without inherit the secret is gone (the inherit binding is what kept it)...
	bare := firstUpload("v3")
	bare.Secrets = nil
	_, err = f.sdk.Scripts.Update(ctx, "tsw-two", bare.ScriptParams(account))
	require.NoError(t, err)
	a = fetchAnswer(t, f, "https://tsw-two."+subdomain+".workers.dev/")
	require.Equal(t, "v3", a.Marker)
	require.Nil(t, a.APIKey)

	// ...and a strict inherit of a binding the previous version lacks is refused, changing nothing.
	_, err = f.sdk.Scripts.Update(ctx, "tsw-two", change.ScriptParams(account))
	e := apiError(t, err)
	require.True(t, e.HasCode(cfstandin.CodeValidation), e.Error())
	sc, _ := f.standin.Script("tsw-two")
	require.Equal(t, 3, sc.Uploads)
}

func TestDeletedScriptReadsBackAsCloudflaresNotFound(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	_, err := f.sdk.Scripts.Update(ctx, "tsw-gone", firstUpload("v1").ScriptParams(account))
	require.NoError(t, err)
	enableSubdomain(t, f, "tsw-gone", true)
	fetchAnswer(t, f, "https://tsw-gone."+subdomain+".workers.dev/")

	_, err = f.sdk.Scripts.Delete(ctx, "tsw-gone", params[workers.ScriptDeleteParams]())
	require.NoError(t, err)

	_, err = f.sdk.Scripts.ScriptAndVersionSettings.Get(ctx, "tsw-gone", params[workers.ScriptScriptAndVersionSettingGetParams]())
	e := apiError(t, err)
	require.True(t, e.IsNotFound(), e.Error())
	_, err = f.sdk.Scripts.Delete(ctx, "tsw-gone", params[workers.ScriptDeleteParams]())
	require.True(t, apiError(t, err).IsNotFound())

	status, _ := fetch(t, f, "https://tsw-gone."+subdomain+".workers.dev/", nil)
	require.Equal(t, http.StatusNotFound, status)
	for _, r := range f.standin.Requests() {
		require.NotContains(t, r.Path, "force=true", "a delete is never forced")
	}
	require.Empty(t, f.standin.ScriptNames(""))
}

func TestSubdomainRouteEnableDisableReadsBack(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	_, err := f.sdk.Scripts.Update(ctx, "tsw-route", firstUpload("v1").ScriptParams(account))
	require.NoError(t, err)
	url := "https://tsw-route." + subdomain + ".workers.dev/"

	enableSubdomain(t, f, "tsw-route", true)
	got, err := f.sdk.Scripts.Subdomain.Get(ctx, "tsw-route", params[workers.ScriptSubdomainGetParams]())
	require.NoError(t, err)
	require.True(t, got.Enabled)
	fetchAnswer(t, f, url)

	_, err = f.sdk.Scripts.Subdomain.Delete(ctx, "tsw-route", params[workers.ScriptSubdomainDeleteParams]())
	require.NoError(t, err)
	got, err = f.sdk.Scripts.Subdomain.Get(ctx, "tsw-route", params[workers.ScriptSubdomainGetParams]())
	require.NoError(t, err)
	require.False(t, got.Enabled)
	require.False(t, got.PreviewsEnabled)
	status, _ := fetch(t, f, url, nil)
	require.Equal(t, http.StatusNotFound, status)

	_, err = f.sdk.Scripts.Subdomain.Get(ctx, "tsw-nothing", params[workers.ScriptSubdomainGetParams]())
	require.True(t, apiError(t, err).IsNotFound())
}

func TestRefusedScriptIsCloudflaresValidationErrorAndLeavesNothing(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *cfstandin.Config) { c.MaxScriptSize = 4 << 10 })
	ctx := context.Background()

	broken := firstUpload("v1")
	broken.Modules = []cloudflare.Module{{Name: "worker.js", Content: []byte("export default { fetch( {")}}
	_, err := f.sdk.Scripts.Update(ctx, "tsw-broken", broken.ScriptParams(account))
	e := apiError(t, err)
	require.Equal(t, http.StatusBadRequest, e.Status)
	require.True(t, e.IsRefusedScript(), e.Error())
	require.Contains(t, e.Message(), "SyntaxError", "Cloudflare's message names the failure")
	require.NotContains(t, e.Error(), "s3cr3t-value")

	big := firstUpload("v1")
	big.Modules = append(big.Modules, cloudflare.Module{Name: "pad.txt", ContentType: "text/plain", Content: []byte(strings.Repeat("x", 5<<10))})
	_, err = f.sdk.Scripts.Update(ctx, "tsw-broken", big.ScriptParams(account))
	e = apiError(t, err)
	require.True(t, e.HasCode(cfstandin.CodeScriptTooLarge), e.Error())

	require.Empty(t, f.standin.ScriptNames(""))
}

func TestKVPutGetDeleteWithAStaleEdgeWindow(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	put := func(value string) {
		t.Helper()
		p := params[kvUpdateParams]()
		p.Value.Value, p.Value.Present = kvString(value), true
		_, err := f.sdk.KVValues.Update(ctx, routingKV, "key/with:odd!chars", p)
		require.NoError(t, err)
	}
	get := func() (string, error) {
		res, err := f.sdk.KVValues.Get(ctx, routingKV, "key/with:odd!chars", params[kvGetParams]())
		if err != nil {
			return "", err
		}
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		return string(b), err
	}

	put("one")
	v, err := get()
	require.NoError(t, err)
	require.Equal(t, "one", v, "the API reads its own write")
	_, seen := f.standin.EdgeKVValue(routingKV, "key/with:odd!chars")
	require.False(t, seen, "the edge does not see a new key within the stale window")
	f.clock.Advance(61 * time.Second)
	edge, seen := f.standin.EdgeKVValue(routingKV, "key/with:odd!chars")
	require.True(t, seen)
	require.Equal(t, "one", string(edge))

	put("two")
	edge, _ = f.standin.EdgeKVValue(routingKV, "key/with:odd!chars")
	require.Equal(t, "one", string(edge), "the edge keeps the old value after a write")

	_, err = f.sdk.KVValues.Delete(ctx, routingKV, "key/with:odd!chars", params[kvDeleteParams]())
	require.NoError(t, err)
	_, err = get()
	e := apiError(t, err)
	require.Equal(t, http.StatusNotFound, e.Status)
	require.True(t, e.HasCode(cfstandin.CodeKVKeyNotFound), e.Error())
	edge, seen = f.standin.EdgeKVValue(routingKV, "key/with:odd!chars")
	require.True(t, seen, "the edge keeps serving the deleted value within the stale window")
	require.Equal(t, "one", string(edge))
	f.clock.Advance(61 * time.Second)
	_, seen = f.standin.EdgeKVValue(routingKV, "key/with:odd!chars")
	require.False(t, seen)
}

func TestRateLimitBlocksEveryCallWith429AndRetryAfter(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *cfstandin.Config) { c.RateLimit = 3; c.RateWindow = time.Minute; c.RateBlock = 5 * time.Minute })
	ctx := context.Background()
	get := func() error {
		_, err := f.sdk.Subdomains.Get(ctx, params[workers.SubdomainGetParams]())
		return err
	}
	for range 3 {
		require.NoError(t, get())
	}
	before := len(f.standin.Requests())
	e := apiError(t, get())
	require.True(t, e.IsRateLimited())
	require.Equal(t, 5*time.Minute, e.RetryAfter)
	require.True(t, e.HasCode(cfstandin.CodeRateLimited))
	require.Len(t, f.standin.Requests(), before+1, "the SDK did not retry the 429 itself")

	f.clock.Advance(4 * time.Minute)
	e = apiError(t, get())
	require.Equal(t, time.Minute, e.RetryAfter, "the block holds every call for its whole length")
	f.clock.Advance(time.Minute)
	require.NoError(t, get())
}

func TestLostAnswerToAnUploadIsNotResentBySDK(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	require.NoError(t, f.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPut, PathContains: "/workers/scripts/tsw-lost"}))

	_, err := f.sdk.Scripts.Update(ctx, "tsw-lost", firstUpload("v1").ScriptParams(account))
	require.Error(t, err)
	_, isAnswer := cloudflare.AsAPIError(err)
	require.False(t, isAnswer, "a lost answer is not an answer")
	require.NotContains(t, err.Error(), "s3cr3t-value")

	puts := 0
	for _, r := range f.standin.Requests() {
		if r.Method == http.MethodPut {
			puts++
			require.True(t, r.Applied)
			require.Equal(t, cfstandin.FaultLostAnswer, r.Fault)
		}
	}
	require.Equal(t, 1, puts, "the secret-bearing upload was sent once")
	sc, ok := f.standin.Script("tsw-lost")
	require.True(t, ok, "the change was made although its answer was lost")
	require.Equal(t, 1, sc.Uploads)
}

func TestInjectedServerErrorAndSlowAnswer(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *cfstandin.Config) { c.Workerd = "" })
	ctx := context.Background()
	require.NoError(t, f.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultServerError, Status: http.StatusBadGateway, Times: 1}))
	_, err := f.sdk.Subdomains.Get(ctx, params[workers.SubdomainGetParams]())
	e := apiError(t, err)
	require.Equal(t, http.StatusBadGateway, e.Status)
	require.True(t, e.HasCode(cfstandin.CodeInternal))
	require.Len(t, f.standin.Requests(), 1, "the SDK did not retry the 5xx itself")

	require.NoError(t, f.standin.Inject(cfstandin.Fault{Kind: cfstandin.FaultSlow, Delay: 5 * time.Second}))
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = f.sdk.Subdomains.Get(short, params[workers.SubdomainGetParams]())
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Less(t, time.Since(start), 3*time.Second)
	_, err = f.sdk.Subdomains.Get(ctx, params[workers.SubdomainGetParams]())
	require.NoError(t, err, "a fault meets only the requests it was armed for")
}

func TestBadTokenIsAnAuthErrorThatNamesNoToken(t *testing.T) {
	t.Parallel()
	f := setup(t, func(c *cfstandin.Config) { c.Workerd = "" })
	const wrong = "wrong-token-that-must-not-leak-42"
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: f.standin.BaseURL(), Token: vocab.NewSecret(wrong)})
	require.NoError(t, err)
	_, err = sdk.Scripts.Update(context.Background(), "tsw-auth", firstUpload("v1").ScriptParams(account))
	e := apiError(t, err)
	require.Equal(t, http.StatusForbidden, e.Status)
	require.True(t, e.IsAuth(), e.Error())
	for _, text := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", e), e.Error(), e.Message()} {
		require.NotContains(t, text, wrong)
		require.NotContains(t, text, token)
	}
	require.Empty(t, f.standin.ScriptNames(""))
}

func TestSDKReadsNothingFromCloudflareEnvironmentVariables(t *testing.T) {
	// Not parallel: it sets process environment.
	f := setup(t, func(c *cfstandin.Config) { c.Workerd = "" })
	decoy := setup(t, func(c *cfstandin.Config) { c.Workerd = "" })
	canaries := map[string]string{
		"CLOUDFLARE_API_TOKEN":            "canary-token-7f3a",
		"CLOUDFLARE_API_KEY":              "canary-key-91c2",
		"CLOUDFLARE_EMAIL":                "canary@example.test",
		"CLOUDFLARE_API_USER_SERVICE_KEY": "canary-service-key-5d0e",
		"CLOUDFLARE_BASE_URL":             decoy.standin.BaseURL(),
	}
	for k, v := range canaries {
		t.Setenv(k, v)
	}
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: f.standin.BaseURL(), Token: vocab.NewSecret(token)})
	require.NoError(t, err)
	_, err = sdk.Subdomains.Get(context.Background(), params[workers.SubdomainGetParams]())
	require.NoError(t, err)

	require.Len(t, f.standin.Requests(), 1)
	require.Empty(t, decoy.standin.Requests(), "CLOUDFLARE_BASE_URL was not used")
	for k, v := range canaries {
		if k != "CLOUDFLARE_BASE_URL" {
			require.Falsef(t, f.standin.SawCredential(v), "%s reached the API", k)
		}
	}
	require.True(t, f.standin.SawCredential(token))
}

func TestNewRefusesAnEmptyTokenAndABadBaseURL(t *testing.T) {
	t.Parallel()
	_, err := cloudflare.New(cloudflare.Options{BaseURL: "http://127.0.0.1:1/client/v4/"})
	require.Error(t, err)
	_, err = cloudflare.New(cloudflare.Options{BaseURL: "ftp://x/", Token: vocab.NewSecret("t")})
	require.Error(t, err)
	var e *cloudflare.APIError
	require.False(t, errors.As(err, &e))
}

type (
	kvUpdateParams = kv.NamespaceValueUpdateParams
	kvGetParams    = kv.NamespaceValueGetParams
	kvDeleteParams = kv.NamespaceValueDeleteParams
)

func kvString(s string) kv.NamespaceValueUpdateParamsValueUnion { return shared.UnionString(s) }

// A script's cron triggers go through the schedules API as the SDK sends them (a JSON array of
// {"cron"}): set, read back sorted, replaced, refused when one is not a cron expression, removed
// by an empty list; a script that does not exist has none to set.
func TestSchedulesAreSetReadBackAndRemoved(t *testing.T) {
	t.Parallel()
	f := setup(t, nil)
	ctx := context.Background()
	acct := cloudflare.Account{ID: account}
	_, err := f.sdk.Scripts.Update(ctx, "tsw-cron", firstUpload("v1").ScriptParams(account))
	require.NoError(t, err)
	require.NoError(t, acct.SetSchedules(ctx, f.sdk, "tsw-cron", []string{"0 * * * *", "*/5 * * * *"}))
	got, err := acct.Schedules(ctx, f.sdk, "tsw-cron")
	require.NoError(t, err)
	require.Equal(t, []string{"*/5 * * * *", "0 * * * *"}, got)

	err = acct.SetSchedules(ctx, f.sdk, "tsw-cron", []string{"not a cron"})
	require.Equal(t, http.StatusBadRequest, apiError(t, err).Status)
	got, err = acct.Schedules(ctx, f.sdk, "tsw-cron")
	require.NoError(t, err)
	require.Len(t, got, 2, "a refused update changes nothing")

	require.NoError(t, acct.SetSchedules(ctx, f.sdk, "tsw-cron", nil))
	got, err = acct.Schedules(ctx, f.sdk, "tsw-cron")
	require.NoError(t, err)
	require.Empty(t, got)
	require.True(t, apiError(t, acct.SetSchedules(ctx, f.sdk, "tsw-none", []string{"* * * * *"})).IsNotFound())
}
