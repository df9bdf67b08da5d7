package runtime_test

import (
	"encoding/base64"
	"encoding/hex"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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
// gets none of it into its log nor the node's, and one that floods its output is cut to the rate
// limit with a count of what was dropped (SPEC 5.1, secrets).
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
	lines := f.workerLines("encoder", "uid-enc", func(lines []string) bool { return slices.ContainsFunc(lines, isPrefix("hex ")) })

	text := strings.Join(lines, "\n") + f.h.Logs.String()
	b := []byte(canary)
	for _, form := range []string{
		canary, base64.StdEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		base64.StdEncoding.EncodeToString([]byte("x" + canary + "yz")), base64.StdEncoding.EncodeToString([]byte("xy" + canary)),
		base64.StdEncoding.EncodeToString([]byte("xyz" + canary + "w")), hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
	} {
		require.NotContains(t, text, form)
	}
	for _, want := range []string{"btoa [redacted]", "url [redacted]", "hex [redacted] HEX [redacted]"} {
		require.Contains(t, lines, want)
	}
	inside := lines[slices.IndexFunc(lines, isPrefix("inside "))]
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
	// Every line of the flood is in the log or counted as dropped (the count arrives a moment
	// after the lines it stands for); so are the request's four other lines, in either.
	var flooded, dropped int
	require.Eventually(t, func() bool {
		page, err := f.client.Logs(f.ctx, "encoder", adminapi.LogQuery{WorkerUID: "uid-enc"})
		if err != nil {
			return false
		}
		flooded, dropped = 0, 0
		for _, e := range page.Entries {
			dropped += e.Dropped
			if strings.HasPrefix(e.Message, "flood ") {
				flooded++
			}
		}
		return flooded+dropped >= 2000
	}, 10*time.Second, 20*time.Millisecond, "the log holds or counts the flood")
	require.Positive(t, dropped, "the flood was cut")
	require.Less(t, flooded, 400, "a flood of 2000 lines is cut near the burst")
	require.Positive(t, flooded)
	require.LessOrEqual(t, flooded+dropped, 2004, "no line counted twice")
	require.NotContains(t, f.h.Logs.String(), "flood 1", "a tenant's lines are its own log's, not the node's")
}

// workerLines reads a worker's log until done holds of its messages, and returns them.
func (f *fixture) workerLines(name, uid string, done func([]string) bool) []string {
	f.t.Helper()
	var lines []string
	require.Eventually(f.t, func() bool {
		page, err := f.client.Logs(f.ctx, name, adminapi.LogQuery{WorkerUID: uid})
		if err != nil {
			return false
		}
		lines = messages(page)
		return done(lines)
	}, 10*time.Second, 20*time.Millisecond, "the log of %s", name)
	return lines
}

func isPrefix(prefix string) func(string) bool {
	return func(s string) bool { return strings.HasPrefix(s, prefix) }
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
		if err != nil || !d.Type().IsRegular() {
			return err // directories, and the sockets of running processes
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
	// Each worker's log holds what it was let through and counts the rest: all 1,000 lines each.
	logged := map[string]int{}
	for _, s := range []struct{ name, uid string }{{"flood-a", "uid-fa"}, {"flood-b", "uid-fb"}, {"flood-c", "uid-fc"}} {
		require.Eventually(t, func() bool {
			page, err := f.client.Logs(f.ctx, s.name, adminapi.LogQuery{WorkerUID: s.uid})
			if err != nil {
				return false
			}
			lines, dropped := 0, 0
			for _, e := range page.Entries {
				if strings.Contains(e.Message, "flood ") {
					lines++
				}
				dropped += e.Dropped
			}
			logged[s.name] = lines
			return lines+dropped == 1000
		}, 10*time.Second, 20*time.Millisecond, "%s's lines, logged or counted", s.name)
	}
	t.Logf("kept: %v", logged)
	// The organization's burst (200) is shared, each worker's ring lets 100 through: two budgets
	// would have let both workers of org-flood through with 100 each. One budget lets the second
	// through only what it refilled (100 lines a second) since the first emptied it: a few lines
	// here, 78 once in a loaded run of the whole package.
	require.Less(t, logged["flood-a"]+logged["flood-b"], 196, "two workers of one organization got a budget each")
	require.GreaterOrEqual(t, logged["flood-c"], 90, "another organization's worker was held by the first one's budget")
}
