package runtime_test

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

// The admin API's /metrics names every tenant's scripts: without the token it answers 401 and
// names none (SPEC 5.1, control channel).
func TestMetricsNeedTheToken(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("tenant-secret-name-5c1e", "uid-m", 1, "m")
	f.waitReady("tenant-secret-name-5c1e")
	for _, token := range []string{"", "wrong", f.token() + "x"} {
		code, body := f.raw(http.MethodGet, adminapi.PathMetrics, token, nil)
		require.Equal(t, http.StatusUnauthorized, code, body)
		require.NotContains(t, body, "tenant-secret-name-5c1e")
	}
	code, body := f.raw(http.MethodGet, adminapi.PathMetrics, f.token(), nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `takoform_runtime_incident{script="tenant-secret-name-5c1e"}`, "the scraper with the token sees the scripts")
	code, _ = f.raw(http.MethodGet, adminapi.PathHealth, "", nil)
	require.Equal(t, http.StatusOK, code, "the liveness check names nothing and needs no token")
}

// A worker that logs its secret encoded (btoa, base64url, inside a longer base64 string, hex)
// gets none of it into the node's log, and one that floods its output is cut to the rate limit
// with a summary of what was dropped (SPEC 5.1, secrets).
func TestWorkerOutputIsScrubbedOfEncodedValuesAndRateLimited(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-e2e-b64?>~9c"
	put := f.scriptPut("uid-enc", 1, "enc", "TOKEN")
	put.Modules = map[string]string{"main.js": `export default {
  fetch(req, env) {
    const s = env.TOKEN;
    const hex = [...new TextEncoder().encode(s)].map(b => b.toString(16).padStart(2, "0")).join("");
    console.log("btoa " + btoa(s));
    console.log("url " + btoa(s).replaceAll("+", "-").replaceAll("/", "_").replaceAll("=", ""));
    console.log("inside " + btoa("x" + s + "yz") + " " + btoa("xy" + s) + " " + btoa("xyz" + s + "w"));
    console.log("hex " + hex + " HEX " + hex.toUpperCase());
    if (new URL(req.url).pathname === "/flood") {
      for (let i = 0; i < 2000; i++) console.log("flood " + i);
    }
    return new Response("logged\n");
  }
};`}
	_, err := f.client.PutScript(f.ctx, "encoder", put)
	require.NoError(t, err)
	f.route("encoder.workers.localhost", "encoder", "ep-enc")
	f.deliver("encoder", "uid-enc", "delivery-enc", canary)
	f.waitReady("encoder")
	f.answers("encoder.workers.localhost", "logged\n")
	require.Eventually(t, func() bool { return strings.Contains(f.h.Logs.String(), "HEX [redacted]") },
		10*time.Second, 20*time.Millisecond, "workerd's output reaches the log, scrubbed")

	logs := f.h.Logs.String()
	b := []byte(canary)
	for _, form := range []string{
		canary, base64.StdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		base64.StdEncoding.EncodeToString([]byte("x" + canary + "yz")), base64.StdEncoding.EncodeToString([]byte("xy" + canary)),
		base64.StdEncoding.EncodeToString([]byte("xyz" + canary + "w")), hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
	} {
		require.NotContains(t, logs, form)
	}
	for _, marker := range []string{`"btoa [redacted]"`, `"url [redacted]"`, `"hex [redacted] HEX [redacted]"`} {
		require.Contains(t, logs, marker)
	}
	inside := outputLine(t, logs, "inside ")
	require.Equal(t, 3, strings.Count(inside, "[redacted]"), inside)
	// What stays of btoa(prefix + value + suffix) is the prefix's and suffix's own characters and at
	// most one character at each end that mixes them with the value's first or last bits.
	for _, word := range strings.Fields(inside)[1:] {
		for _, part := range strings.Split(word, "[redacted]") {
			require.LessOrEqual(t, len(strings.TrimRight(part, "=")), 5, "left of %q: %q", word, part)
		}
	}

	code, body, _ := f.h.Get(t, "encoder.workers.localhost", "/flood")
	require.Equal(t, http.StatusOK, code, body)
	require.Eventually(t, func() bool { return strings.Contains(f.h.Logs.String(), "over the rate limit") },
		10*time.Second, 20*time.Millisecond, "a summary line reports the dropped lines")
	flooded := strings.Count(f.h.Logs.String(), `"line":"flood `)
	require.Less(t, flooded, 400, "a flood of 2000 lines is cut near the burst")
	require.Positive(t, flooded)
	require.Equal(t, 1, strings.Count(f.h.Logs.String(), "over the rate limit"), "one summary for one flood")
}

// outputLine finds the logged workerd output line that starts with prefix.
func outputLine(t *testing.T, logs, prefix string) string {
	t.Helper()
	for _, record := range strings.Split(logs, "\n") {
		var entry struct {
			Msg  string `json:"msg"`
			Line string `json:"line"`
		}
		if json.Unmarshal([]byte(record), &entry) == nil && entry.Msg == "workerd output" && strings.HasPrefix(entry.Line, prefix) {
			return entry.Line
		}
	}
	t.Fatalf("no workerd output line starts with %q", prefix)
	return ""
}

// After a start (and a restart) with a delivery sealed, the state directory holds no key material:
// the runtime's sealing key lives only in its own file outside it (SPEC 5.1), and the restarted
// node opens its deliveries with that file.
func TestTheStateDirectoryHoldsNoKeyMaterial(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-keyless-state-3d1"
	f.script("keyless", "uid-k", 1, "k", "TOKEN")
	f.route("keyless.workers.localhost", "keyless", "ep-k")
	f.deliver("keyless", "uid-k", "delivery-k", canary)
	f.waitReady("keyless")
	f.h.Restart(t)
	f.reconnect()
	f.answers("keyless.workers.localhost", expectReply("k", canary))

	keyFile := f.h.Config().SealingKeyFile
	keyText, err := os.ReadFile(keyFile)
	require.NoError(t, err)
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(keyText)))
	require.NoError(t, err)
	require.Len(t, key, 32)
	rel, err := filepath.Rel(f.h.StateDir, keyFile)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(rel, ".."), "the key file %s is outside the state directory", keyFile)
	files := 0
	require.NoError(t, filepath.WalkDir(f.h.StateDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		files++
		require.NotEqual(t, state.LegacyKeyFile, d.Name())
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		for _, form := range []string{strings.TrimSpace(string(keyText)), string(key), hex.EncodeToString(key)} {
			require.False(t, strings.Contains(string(b), form), "key material in %s", path) // never printed
		}
		return nil
	}))
	require.GreaterOrEqual(t, files, 3, "the walk saw the token, the desired state and the sealed delivery")
}

// Client certificates are asked for in a TLS handshake: --admin-client-ca without the admin API's
// own certificate is refused rather than silently ignored.
func TestAdminClientCANeedsTLS(t *testing.T) {
	t.Parallel()
	_, err := runtime.Start(runtime.Config{StateDir: filepath.Join(t.TempDir(), "rt"), SealingKeyFile: runtimetest.SealingKeyFile(t),
		Workerd: workerdtest.Binary(t), AdminClientCA: filepath.Join(t.TempDir(), "ca.pem"), AdminListener: newListener(t), EdgeListener: newListener(t)})
	require.ErrorContains(t, err, "--admin-client-ca needs --admin-tls-cert")
}

// floodSource logs 1,000 lines tagged with its name on every request.
func floodSource(tag string) string {
	return `export default { fetch() { for (let i = 0; i < 1000; i++) console.log("` + tag + ` " + i); return new Response("done"); } };`
}

// Two workers of one organization share the organization's one log budget; another organization's
// worker has its own: a tenant's lines are rate-limited as a tenant's, however many workers it runs.
func TestATenantsWorkersShareOneLogBudget(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.orgScript("flood-a", "org-flood", "uid-fa", floodSource("tenantflood"))
	f.orgScript("flood-b", "org-flood", "uid-fb", floodSource("tenantflood"))
	f.orgScript("flood-c", "org-other", "uid-fc", floodSource("otherflood"))
	for _, s := range []string{"flood-a", "flood-b", "flood-c"} {
		f.route(s+".workers.localhost", s, "ep-"+s)
		f.waitReady(s)
	}
	for _, s := range []string{"flood-a", "flood-b", "flood-c"} {
		code, body, _ := f.h.Get(t, s+".workers.localhost", "/")
		require.Equal(t, http.StatusOK, code, body)
	}
	require.Eventually(t, func() bool { return strings.Count(f.h.Logs.String(), "over the rate limit") >= 2 },
		10*time.Second, 20*time.Millisecond, "both tenants' floods are reported")
	tenant := strings.Count(f.h.Logs.String(), `"line":"tenantflood `)
	other := strings.Count(f.h.Logs.String(), `"line":"otherflood `)
	// One burst (200) and what refills while the two floods run: two budgets would let 400 through.
	require.Less(t, tenant, 320, "two workers of one organization got a budget each")
	require.GreaterOrEqual(t, other, 150, "another organization's worker was held by the first one's budget")
}
