package runtime_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// workerSource answers with its version and what it received in env.TOKEN: only a length and a
// digest, never the value.
func workerSource(version string) string {
	return `export default {
  async fetch(req, env) {
    const s = env.TOKEN ?? "";
    const d = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(s));
    const hex = [...new Uint8Array(d)].map(b => b.toString(16).padStart(2, "0")).join("");
    return new Response("version=` + version + ` len=" + s.length + " sha256=" + hex + "\n");
  }
};`
}

func sha(s string) string {
	d := sha256.Sum256([]byte(s))
	return hex.EncodeToString(d[:])
}

func expectReply(version, secret string) string {
	return fmt.Sprintf("version=%s len=%d sha256=%s\n", version, len(secret), sha(secret))
}

type fixture struct {
	t      *testing.T
	h      *runtimetest.Harness
	client *selfhost.Client
	ctx    context.Context
	seq    atomic.Int64
}

func setup(t *testing.T, mutate ...func(*runtime.Config)) *fixture {
	t.Helper()
	return newFixture(t, runtimetest.Start(t, mutate...))
}

// setupWithoutWorkerd is setup with incarnations that run no code (runtimetest.Processes), for
// what the admin API, the reconciler and the edge's routing decide on their own: each answers
// "<script> <incarnation id>".
func setupWithoutWorkerd(t *testing.T, mutate ...func(*runtime.Config)) (*fixture, *runtimetest.Processes) {
	t.Helper()
	h, p := runtimetest.StartWithoutWorkerd(t, mutate...)
	return newFixture(t, h), p
}

func newFixture(t *testing.T, h *runtimetest.Harness) *fixture {
	t.Helper()
	c, err := selfhost.New(h.Info.AdminURL, h.Info.TokenFile)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	f := &fixture{t: t, h: h, client: c, ctx: ctx}
	t.Cleanup(func() {
		// What went wrong on the node's side, for a failure seen in CI only.
		if t.Failed() {
			for _, line := range strings.Split(h.Logs.String(), "\n") {
				if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
					t.Log(line)
				}
			}
		}
	})
	return f
}

func (f *fixture) effect() string { return fmt.Sprintf("effect-%d", f.seq.Add(1)) }

func (f *fixture) reconnect() {
	c, err := selfhost.New(f.h.Info.AdminURL, f.h.Info.TokenFile)
	require.NoError(f.t, err)
	f.client = c
}

// script PUTs a script of one version at a generation, for worker UID uid.
func (f *fixture) script(name, uid string, generation int64, version string, secretNames ...string) adminapi.ScriptStatus {
	f.t.Helper()
	st, err := f.client.PutScript(f.ctx, name, f.scriptPut(uid, generation, version, secretNames...))
	require.NoError(f.t, err)
	return st
}

func (f *fixture) scriptPut(uid string, generation int64, version string, secretNames ...string) adminapi.ScriptPut {
	return adminapi.ScriptPut{
		EffectID: f.effect(), WorkerUID: uid, DeploymentID: fmt.Sprintf("dep-%s-%d", uid, generation), Generation: generation,
		Labels:  adminapi.Labels{Organization: "org-1", Space: "prod", Worker: "w-" + uid},
		Modules: map[string]string{"main.js": workerSource(version)}, MainModule: "main.js",
		CompatibilityDate: "2024-09-23", SecretNames: secretNames, BundleDigest: "sha256:" + sha(version),
	}
}

func (f *fixture) deliver(name, uid, deliveryID, value string) {
	f.t.Helper()
	_, err := f.client.PutSecrets(f.ctx, name, adminapi.SecretsPut{
		EffectID: f.effect(), WorkerUID: uid, DeliveryID: deliveryID, Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret(value)},
	})
	require.NoError(f.t, err)
}

func (f *fixture) route(host, script, endpoint string) adminapi.RouteStatus {
	f.t.Helper()
	st, err := f.client.PutRoute(f.ctx, host, adminapi.RoutePut{EffectID: f.effect(), ScriptName: script, EndpointUID: endpoint, DeploymentID: "dep-" + endpoint})
	require.NoError(f.t, err)
	return st
}

func (f *fixture) waitReady(name string) adminapi.ScriptStatus {
	f.t.Helper()
	return f.waitStatus("script "+name+" Ready", func(s adminapi.ScriptStatus) bool { return s.Ready }, name)
}

// waitStatus polls the script's status until cond holds; a failed read is retried, and the last
// status and error are in the failure.
func (f *fixture) waitStatus(what string, cond func(adminapi.ScriptStatus) bool, name string) adminapi.ScriptStatus {
	f.t.Helper()
	var st adminapi.ScriptStatus
	var lastErr error
	ok := assert.Eventually(f.t, func() bool {
		got, err := f.client.GetScript(f.ctx, name)
		if err != nil {
			lastErr = err
			return false
		}
		st, lastErr = got, nil
		return cond(st)
	}, 30*time.Second, 20*time.Millisecond, "%s", what)
	if !ok {
		f.t.Fatalf("%s: last status %+v, last error %v", what, st, lastErr)
	}
	return st
}

// serveWithSecret deploys generation 1 of a script (version) declaring TOKEN, routes
// <name>.workers.localhost to it, delivers value as TOKEN and waits until it answers with it.
func (f *fixture) serveWithSecret(name, uid, version, value string) adminapi.ScriptStatus {
	f.t.Helper()
	f.script(name, uid, 1, version, "TOKEN")
	f.route(name+".workers.localhost", name, "ep-"+name)
	f.deliver(name, uid, "delivery-"+name, value)
	st := f.waitReady(name)
	f.answers(name+".workers.localhost", expectReply(version, value))
	return st
}

// churn deploys a script (version n1) and then each generation up to last (version n<gen>),
// waiting each time until the newest serves: every start, promotion, drain and stop kicks the
// reconciler.
func (f *fixture) churn(name, uid string, last int64) {
	f.t.Helper()
	f.script(name, uid, 1, "n1")
	f.waitReady(name)
	for gen := int64(2); gen <= last; gen++ {
		f.script(name, uid, gen, fmt.Sprintf("n%d", gen))
		f.waitStatus(name+" serving its newest generation", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Generation == gen
		}, name)
	}
}

// holds checks every 50 ms for d that check keeps passing; the first failure fails the test.
// It is for what must stay true (a process that must not come back), never for synchronization.
func (f *fixture) holds(what string, d time.Duration, check func() error) {
	f.t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if err := check(); err != nil {
			f.t.Fatalf("%s: %v", what, err)
		}
	}
}

func (f *fixture) answers(host, want string) {
	f.t.Helper()
	var code int
	var body string
	var lastErr error
	ok := assert.Eventually(f.t, func() bool {
		code, body, _, lastErr = f.h.TryGet(host, "/")
		return lastErr == nil && code == http.StatusOK && body == want
	}, 30*time.Second, 20*time.Millisecond, "%s never answered %q", host, want)
	if !ok {
		f.t.Fatalf("%s: last answer %d %q, last error %v", host, code, body, lastErr)
	}
}

func (f *fixture) raw(method, path, token string, body any) (int, string) {
	f.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(f.t, err)
		r = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, f.h.Info.AdminURL+path, r)
	require.NoError(f.t, err)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(f.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(f.t, err)
	return resp.StatusCode, string(b)
}

func (f *fixture) metrics() string {
	_, body := f.raw(http.MethodGet, adminapi.PathMetrics, f.token(), nil)
	return body
}

func (f *fixture) kill(name string) int {
	f.t.Helper()
	st, err := f.client.GetScript(f.ctx, name)
	require.NoError(f.t, err)
	require.NotNil(f.t, st.Incarnation)
	pid := st.Incarnation.PID
	require.NotZero(f.t, pid)
	require.NoError(f.t, syscall.Kill(pid, syscall.SIGKILL))
	return pid
}

// requireNowhere checks that a value is in no file under dir, no log line and no admin answer.
func requireNowhere(t *testing.T, value, dir string, texts ...string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err // directories, and the sockets of running processes
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		require.NotContains(t, string(b), value, "plain text of a secret in %s", path)
		return nil
	}))
	for _, text := range texts {
		require.NotContains(t, text, value)
	}
}

func TestWorkerAnswersAtItsHostWithItsSecretWhichIsNowhereElse(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-e2e-Zq81vX"
	f.script("hello-prod-1a2b3c4d", "uid-1", 1, "v1", "TOKEN")
	f.route("hello.workers.localhost", "hello-prod-1a2b3c4d", "ep-1")
	st := f.waitStatus("deployment incarnation Ready, secrets pending", func(s adminapi.ScriptStatus) bool {
		return s.Incarnation != nil && s.Incarnation.State == adminapi.StateReady
	}, "hello-prod-1a2b3c4d")
	require.False(t, st.Ready, "a script that declares secrets is not Ready before its delivery")
	require.Equal(t, adminapi.ReasonSecretsPending, st.Reason)

	f.deliver("hello-prod-1a2b3c4d", "uid-1", "delivery-1", canary)
	st = f.waitReady("hello-prod-1a2b3c4d")
	require.Equal(t, "delivery-1", st.Secrets.DeliveryID)
	require.Equal(t, []string{"TOKEN"}, st.Secrets.Names)
	f.answers("hello.workers.localhost", expectReply("v1", canary))
	code, body, _ := f.h.Get(t, "HELLO.workers.localhost:8787", "/")
	require.Equal(t, http.StatusOK, code, "the Host header's port and case do not matter")
	require.Equal(t, expectReply("v1", canary), body)

	route, err := f.client.GetRoute(f.ctx, "hello.workers.localhost")
	require.NoError(t, err)
	require.True(t, route.Ready)

	// The value reaches the isolate over its process's own socket, from memory: it is in no
	// process's environment or arguments, and no file (below).
	pid := st.Incarnation.PID
	for _, p := range append(descendants(t, pid), pid) {
		for _, file := range []string{"environ", "cmdline"} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", p, file))
			if err == nil {
				require.NotContains(t, string(b), canary, "/proc/%d/%s", p, file)
			}
		}
	}

	// Readback: HMAC(challenge, canonical JSON of the bindings as given to workerd).
	challenge := make([]byte, 32)
	_, _ = rand.Read(challenge)
	rb, err := f.client.Readback(f.ctx, "hello-prod-1a2b3c4d", challenge, "")
	require.NoError(t, err)
	mac := hmac.New(sha256.New, challenge)
	mac.Write(canonjson.Marshal(map[string]string{"TOKEN": canary}))
	require.True(t, rb.Present)
	require.Equal(t, "delivery-1", rb.DeliveryID)
	require.Equal(t, hex.EncodeToString(mac.Sum(nil)), rb.Digest)
	other := make([]byte, 32)
	_, _ = rand.Read(other)
	rb2, err := f.client.Readback(f.ctx, "hello-prod-1a2b3c4d", other, "")
	require.NoError(t, err)
	require.NotEqual(t, rb.Digest, rb2.Digest, "the digest is keyed by the challenge")
	require.NotContains(t, rb.Digest, sha(canary))

	code, bad := f.raw(http.MethodPost, adminapi.ReadbackPath("hello-prod-1a2b3c4d"), f.token(), map[string]string{"challenge": "c2hvcnQ="})
	require.Equal(t, http.StatusUnprocessableEntity, code, bad)

	var answers []string
	status, err := f.client.Status(f.ctx)
	require.NoError(t, err)
	for _, v := range []any{status, st, rb, rb2, route} {
		b, _ := json.Marshal(v)
		answers = append(answers, string(b))
	}
	answers = append(answers, f.metrics(), f.h.Logs.String())
	requireNowhere(t, canary, f.h.StateDir, answers...)

	// Deleting the worker stops it, erases its delivery, and leaves its route answering 503.
	gone, err := f.client.DeleteScript(f.ctx, "hello-prod-1a2b3c4d", "uid-1")
	require.NoError(t, err)
	require.False(t, gone.Present)
	_, err = os.Stat(filepath.Join(f.h.StateDir, "secrets", "uid-1"))
	require.ErrorIs(t, err, os.ErrNotExist, "a deleted worker's delivery is erased")
	code, body, _ = f.h.Get(t, "hello.workers.localhost", "/")
	require.Equal(t, http.StatusServiceUnavailable, code, body)
	// Its organization has nothing else on the node: its process goes, and its sockets with it.
	require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 10*time.Second, 10*time.Millisecond, "its process is gone")
	require.Eventually(t, func() bool {
		entries, err := os.ReadDir(filepath.Join(f.h.StateDir, "sockets"))
		return err == nil && len(entries) == 0
	}, 10*time.Second, 10*time.Millisecond, "an org process's sockets go with it")
}

func (f *fixture) token() string {
	b, err := os.ReadFile(f.h.Info.TokenFile)
	require.NoError(f.t, err)
	return strings.TrimSpace(string(b))
}

func TestEdgeRefusesUnknownHostsAndRouteDeleteIsCompareAndDelete(t *testing.T) {
	t.Parallel()
	f := setup(t)
	code, body, header := f.h.Get(t, "nobody.workers.localhost", "/")
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, adminapi.ProblemContentType, header.Get("Content-Type"))
	var p adminapi.Problem
	require.NoError(t, json.Unmarshal([]byte(body), &p))
	require.Equal(t, adminapi.CodeUnknownHost, p.Code)
	require.Contains(t, f.metrics(), `takoform_runtime_edge_requests_total{code="404"} 1`)

	f.script("site-a", "uid-a", 1, "a")
	f.route("site.workers.localhost", "site-a", "ep-old")
	f.answers("site.workers.localhost", expectReply("a", ""))

	// A second endpoint cannot take a hostname its predecessor still holds.
	_, err := f.client.PutRoute(f.ctx, "site.workers.localhost", adminapi.RoutePut{EffectID: f.effect(), ScriptName: "site-a", EndpointUID: "ep-new", DeploymentID: "d"})
	require.True(t, selfhost.IsCode(err, adminapi.CodeRouteConflict), "%v", err)

	gone, err := f.client.DeleteRoute(f.ctx, "site.workers.localhost", "site-a", "ep-old")
	require.NoError(t, err)
	require.False(t, gone.Present)
	code, _, _ = f.h.Get(t, "site.workers.localhost", "/")
	require.Equal(t, http.StatusNotFound, code, "a removed route stops answering")

	f.route("site.workers.localhost", "site-a", "ep-new")
	// A late delete naming the old endpoint leaves its successor alone.
	left, err := f.client.DeleteRoute(f.ctx, "site.workers.localhost", "site-a", "ep-old")
	require.NoError(t, err)
	require.True(t, left.Present)
	require.Equal(t, "ep-new", left.EndpointUID)
	f.answers("site.workers.localhost", expectReply("a", ""))
	// Deleting an absent route succeeds.
	absent, err := f.client.DeleteRoute(f.ctx, "other.workers.localhost", "site-a", "ep-x")
	require.NoError(t, err)
	require.False(t, absent.Present)
}

// holdSource answers /hold only after a minute (its request stays in flight), anything else at
// once.
const holdSource = `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/hold") await new Promise((r) => setTimeout(r, 60000));
    return new Response("c\n");
  }
};`

// hold starts a request to host's /hold and returns once the node counts it in flight to the
// script; its outcome does not matter (its process is about to end).
func (f *fixture) hold(host, script string) {
	f.t.Helper()
	go func() { _, _, _, _ = f.h.TryGet(host, "/hold") }()
	require.Eventually(f.t, func() bool { return f.h.Node.InFlight(script) > 0 }, 10*time.Second, 5*time.Millisecond,
		"a request of %s in flight", script)
}

// crashyAndCalm deploys two workers of one organization that hold a request to /hold for a
// minute, at crashy.workers.localhost and calm.workers.localhost, and waits until both are Ready.
func (f *fixture) crashyAndCalm() (crashy, calm adminapi.ScriptStatus) {
	f.t.Helper()
	f.putSource("crashy", "uid-c", holdSource)
	f.route("crashy.workers.localhost", "crashy", "ep-c")
	f.putSource("calm", "uid-q", holdSource)
	f.route("calm.workers.localhost", "calm", "ep-q")
	return f.waitReady("crashy"), f.waitReady("calm")
}

// A process that dies (here: killed by someone else) is restarted by continuity, and its
// incarnations are the same ones. One that had a request in flight is implicated: implicated
// twice within an hour, it runs in a process of its own (quarantined); six times, an incident is
// raised while retries go on (SPEC 5, 5.1).
func TestKilledProcessRestartsAsTheSameIncarnationAndRepeatedCrashesRaiseAnIncident(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, calm := f.crashyAndCalm()
	require.Equal(t, first.Incarnation.PID, calm.Incarnation.PID, "one organization's workers share its process")
	f.answers("crashy.workers.localhost", "c\n")

	for kill := 1; kill <= 6; kill++ {
		f.hold("crashy.workers.localhost", "crashy")
		pid := f.kill("crashy")
		st := f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.PID != pid && s.Incarnation.Restarts == kill
		}, "crashy")
		require.Equal(t, first.Incarnation.ID, st.Incarnation.ID, "continuity restarts the same incarnation")
		f.answers("crashy.workers.localhost", "c\n")
		require.Equal(t, kill >= 2, st.Quarantined, "quarantined once implicated twice within an hour (kill %d)", kill)
		require.Equal(t, kill >= 6, st.Incident, "an incident after six implications within an hour, not before (kill %d)", kill)
		if kill == 2 {
			require.Contains(t, st.QuarantineMessage, "a process of its own")
			other := f.waitReady("calm")
			require.NotEqual(t, st.Incarnation.PID, other.Incarnation.PID, "the quarantined worker runs alone")
		}
	}
	st, err := f.client.GetScript(f.ctx, "crashy")
	require.NoError(t, err)
	require.True(t, st.Incident)
	require.Contains(t, st.IncidentMessage, "retries continue")
	other, err := f.client.GetScript(f.ctx, "calm")
	require.NoError(t, err)
	require.False(t, other.Incident || other.Quarantined, "a worker with nothing in flight was never implicated")
	f.answers("calm.workers.localhost", "c\n")
	metrics := f.metrics()
	require.Contains(t, metrics, `takoform_runtime_incident{script="crashy"} 1`)
	require.Contains(t, metrics, `takoform_runtime_restarts_total{script="crashy"} 6`)
}

// A restart of the node forgets neither an implication of the last hour nor a quarantine (SPEC
// 5.1: twice within an hour): implicated once before the node restarted and once after, a worker
// is quarantined, and it still runs alone after the next restart. The node keeps no more than
// ids and times.
func TestANodeRestartForgetsNoImplicationNorQuarantine(t *testing.T) {
	t.Parallel()
	f := setup(t)
	first, _ := f.crashyAndCalm()

	f.hold("crashy.workers.localhost", "crashy")
	pid := f.kill("crashy")
	st := f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Incarnation.PID != pid }, "crashy")
	require.False(t, st.Quarantined, "implicated once")

	f.h.RestartAfter(t, func() {})
	f.reconnect()
	st = f.waitReady("crashy")
	require.Equal(t, first.Incarnation.ID, st.Incarnation.ID)
	require.False(t, st.Quarantined)
	f.hold("crashy.workers.localhost", "crashy")
	pid = f.kill("crashy")
	st = f.waitStatus("quarantined", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Quarantined }, "crashy")
	require.NotEqual(t, pid, st.Incarnation.PID)

	f.h.RestartAfter(t, func() {})
	f.reconnect()
	st = f.waitReady("crashy")
	calm := f.waitReady("calm")
	require.True(t, st.Quarantined, "still quarantined after the node restarted")
	require.NotEqual(t, calm.Incarnation.PID, st.Incarnation.PID, "it runs alone from the start")
	f.answers("crashy.workers.localhost", "c\n")
	f.answers("calm.workers.localhost", "c\n")
	kept, err := os.ReadFile(filepath.Join(f.h.StateDir, state.ImplicationsFile))
	require.NoError(t, err)
	require.Contains(t, string(kept), first.Incarnation.ID)
	require.NotContains(t, string(kept), calm.Incarnation.ID, "a worker never implicated is not kept")
}

// What a node kept of its quarantines is held to the organization's quarantine processes when it
// starts again: with five of one organization's workers kept quarantined, four run alone and the
// fifth answers 503 until one is free. A file that does not parse is set aside with a warning.
func TestKeptQuarantinesAreHeldToTheOrganizationsQuarantineProcesses(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var ids []string
	for i := range orgproc.MaxQuarantine + 1 {
		name := fmt.Sprintf("w%d", i)
		f.orgScript(name, "org-q", "uid-"+name, workerSource(name))
		f.route(name+".test", name, "ep-"+name)
		ids = append(ids, f.waitReady(name).Incarnation.ID)
	}
	kept := map[string]orgproc.Record{}
	for _, id := range ids {
		kept[id] = orgproc.Record{Implications: []time.Time{time.Now().Add(-time.Minute)}, Quarantined: true}
	}
	raw, err := json.Marshal(kept)
	require.NoError(t, err)
	f.h.RestartAfter(t, func() {
		require.NoError(t, safedir.WriteFile(f.h.StateDir, state.ImplicationsFile, raw, safedir.Current()))
	})
	f.reconnect()
	pids := map[int]bool{}
	var blocked []string
	alone := ""
	for i := range orgproc.MaxQuarantine + 1 {
		name := fmt.Sprintf("w%d", i)
		st := f.waitStatus("placed", func(s adminapi.ScriptStatus) bool {
			return s.Quarantined && (s.Ready || s.Reason == adminapi.ReasonQuarantined)
		}, name)
		if st.Ready {
			pids[st.Incarnation.PID] = true
			alone = name
			f.answers(name+".test", expectReply(name, ""))
			continue
		}
		blocked = append(blocked, name)
		require.Contains(t, st.QuarantineMessage, "answers 503")
		code, _, _, err := f.h.TryGet(name+".test", "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusServiceUnavailable, code)
	}
	require.Len(t, blocked, 1)
	require.Len(t, pids, orgproc.MaxQuarantine, "each of the others runs alone")
	// One of theirs deleted, its quarantine process is the waiting one's.
	_, err = f.client.DeleteScript(f.ctx, alone, "uid-"+alone)
	require.NoError(t, err)
	st := f.waitReady(blocked[0])
	require.True(t, st.Quarantined)
	require.False(t, pids[st.Incarnation.PID], "it runs alone")
	f.answers(blocked[0]+".test", expectReply(blocked[0], ""))

	f.h.RestartAfter(t, func() {
		require.NoError(t, safedir.WriteFile(f.h.StateDir, state.ImplicationsFile, []byte("{not json"), safedir.Current()))
	})
	f.reconnect()
	for i := range orgproc.MaxQuarantine + 1 {
		if name := fmt.Sprintf("w%d", i); name != alone {
			require.False(t, f.waitReady(name).Quarantined)
		}
	}
	require.Contains(t, f.h.Logs.String(), "liveness starts without them")
}

// After a restart a worker's isolate is loaded by its first request. A client that leaves during
// that load cancels it, and workerd's Worker Loader keeps a canceled load under the isolate's name:
// every later request used to answer 500 until the process restarted again. The router loads the
// isolate afresh under a new name, and makes the call again unless its body is gone (then 503).
func TestAClientLeavingDuringALoadDoesNotBreakTheWorker(t *testing.T) {
	t.Parallel()
	var held atomic.Bool
	entered, release := make(chan string, 1), make(chan struct{})
	var asked sync.Map // loader id → times its code was given
	f := setup(t, func(c *runtime.Config) {
		c.BeforeCode = func(id string) {
			n, _ := asked.LoadOrStore(id, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			if held.CompareAndSwap(true, false) {
				entered <- id
				<-release
			}
		}
	})
	f.putSource("leaving", "uid-leaving", `export default {
  fetch(req) {
    if (new URL(req.url).pathname === "/throw") throw new Error("The execution context responding to this call was canceled.");
    return new Response("ok " + req.method + "\n");
  }
};`)
	f.route("leaving.test", "leaving", "ep-leaving")
	st := f.waitReady("leaving")
	f.answers("leaving.test", "ok GET\n")
	// A worker's own error of those words is its own: its isolate is not loaded again.
	code, _, _, err := f.h.TryGet("leaving.test", "/throw")
	require.NoError(t, err)
	require.Equal(t, http.StatusInternalServerError, code)
	n, _ := asked.Load(st.Incarnation.ID + ".1")
	require.NotNil(t, n, "loader ids are the incarnation's id and its attempt")
	require.EqualValues(t, 1, n.(*atomic.Int32).Load(), "its code was given once, at its probe")

	// leave sends a GET whose client leaves while the load it started waits for the code, and
	// answers the loader id.
	leave := func() string {
		t.Helper()
		held.Store(true)
		release = make(chan struct{})
		ctx, cancel := context.WithCancel(f.ctx)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
		require.NoError(t, err)
		req.Host = "leaving.test"
		left := make(chan struct{})
		go func() {
			defer close(left)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
		id := <-entered
		cancel()
		<-left
		time.Sleep(300 * time.Millisecond) // the edge sees the client leave, and workerd the request
		close(release)
		return id
	}
	restart := func() {
		t.Helper()
		pid := f.kill("leaving")
		f.waitStatus("restarted", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Incarnation.PID != pid }, "leaving")
	}
	given := func(id string) int32 {
		n, _ := asked.Load(id)
		return n.(*atomic.Int32).Load()
	}

	restart()
	id := leave()

	// A request with a body cannot be made again: it is refused, to be retried, and the isolate
	// is loaded afresh for the next.
	post := func() (int, string, http.Header) {
		req, err := http.NewRequest(http.MethodPost, "http://"+f.h.Info.EdgeAddr+"/", strings.NewReader("body"))
		require.NoError(t, err)
		req.Host = "leaving.test"
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b), resp.Header
	}
	code, body, header := post()
	require.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
	require.Equal(t, "1", header.Get("Retry-After"))
	code, body, _ = post()
	require.Equal(t, http.StatusOK, code, "%s", body)
	require.Equal(t, "ok POST\n", body)
	get := func() int {
		t.Helper()
		code, body, _, err := f.h.TryGet("leaving.test", "/")
		require.NoError(t, err)
		if code != http.StatusServiceUnavailable {
			require.Equal(t, "ok GET\n", body, "%d", code)
		}
		return code
	}
	require.Equal(t, http.StatusOK, get())
	require.EqualValues(t, 3, given(id), "its code was given at its probe, to the canceled load and to the fresh one")

	// A request without a body is made again at once.
	restart()
	leave()
	require.Equal(t, http.StatusOK, get())

	// A client that leaves during every load has the isolate loaded afresh at most once a second:
	// within it, requests are refused (503) and no code is given.
	restart()
	id = leave()
	before := given(id)
	leave() // the next request's fresh load, left too
	require.Equal(t, before+1, given(id))
	require.Equal(t, http.StatusServiceUnavailable, get(), "loaded afresh again within the second")
	require.Equal(t, before+1, given(id), "no code given for a refused request")
	require.Eventually(t, func() bool { return get() == http.StatusOK }, 5*time.Second, 100*time.Millisecond)
}

// A worker's lifecycle brake holds its reload after its process died, while the process comes
// back for its organization's other workers; an organization's brake keeps its process down,
// while other organizations serve. Neither stops what serves (SPEC 5: a worker's lifecycle brake
// holds that incarnation's reload; an organization's keeps its process down).
func TestLifecycleBrakeKeepsAKilledProcessDownWhileOthersServe(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("braked", "uid-b", 1, "b")
	f.script("free", "uid-f", 1, "f")
	f.orgScript("other", "org-2", "uid-o", workerSource("o"))
	f.route("braked.workers.localhost", "braked", "ep-b")
	f.route("free.workers.localhost", "free", "ep-f")
	f.route("other.workers.localhost", "other", "ep-o")
	f.waitReady("braked")
	f.waitReady("free")
	f.waitReady("other")

	scope := adminapi.BrakeScope{Organization: "org-1", Space: "prod", Worker: "w-uid-b"}
	brakes, err := f.client.SetLifecycleBrake(f.ctx, true, scope)
	require.NoError(t, err)
	require.Equal(t, []adminapi.BrakeScope{scope}, brakes.Lifecycle)
	f.answers("braked.workers.localhost", expectReply("b", "")) // the brake stops nothing that serves

	f.kill("braked")
	// The process comes back for the free worker; the braked one is held.
	f.answers("free.workers.localhost", expectReply("f", ""))
	f.waitStatus("held by the brake", func(s adminapi.ScriptStatus) bool {
		return s.Incarnation.Reason == adminapi.ReasonBraked
	}, "braked")
	// Brakes are looked at again every second here at the latest: over 2.5 s, a brake that let
	// go would show as a Ready status or an answer.
	f.holds("a worker held by the brake stays down", 2500*time.Millisecond, func() error {
		st, err := f.client.GetScript(f.ctx, "braked")
		if err != nil {
			return err
		}
		if st.Ready || st.Incarnation.Reason != adminapi.ReasonBraked {
			return fmt.Errorf("reloaded under the brake: ready=%v reason=%s", st.Ready, st.Incarnation.Reason)
		}
		code, _, _, err := f.h.TryGet("braked.workers.localhost", "/")
		if err != nil {
			return err
		}
		if code != http.StatusServiceUnavailable {
			return fmt.Errorf("the braked worker's host answered %d", code)
		}
		return nil
	})
	f.answers("free.workers.localhost", expectReply("f", ""))
	_, err = f.client.SetLifecycleBrake(f.ctx, false, scope)
	require.NoError(t, err)
	f.waitReady("braked")
	f.answers("braked.workers.localhost", expectReply("b", ""))

	// An organization's brake keeps its process down; another organization serves meanwhile.
	orgScope := adminapi.BrakeScope{Organization: "org-1"}
	_, err = f.client.SetLifecycleBrake(f.ctx, true, orgScope)
	require.NoError(t, err)
	f.kill("free")
	f.waitStatus("the organization's process held down", func(s adminapi.ScriptStatus) bool {
		return s.Incarnation.Reason == adminapi.ReasonBraked && s.Incarnation.PID == 0
	}, "free")
	f.holds("an organization held by the brake stays down", 2500*time.Millisecond, func() error {
		for _, name := range []string{"braked", "free"} {
			st, err := f.client.GetScript(f.ctx, name)
			if err != nil {
				return err
			}
			if st.Ready || st.Incarnation.PID != 0 {
				return fmt.Errorf("%s's process restarted under the brake: ready=%v pid=%d reason=%s", name, st.Ready, st.Incarnation.PID, st.Incarnation.Reason)
			}
		}
		return getOK(http.DefaultClient, "http://"+f.h.Info.EdgeAddr+"/", "other.workers.localhost")
	})
	_, err = f.client.SetLifecycleBrake(f.ctx, false, orgScope)
	require.NoError(t, err)
	f.answers("free.workers.localhost", expectReply("f", ""))
	f.answers("braked.workers.localhost", expectReply("b", ""))
}

// A restarted node serves its workers again, with their secrets, as the same admitted
// incarnations, from its own state directory alone: as it left it, or as the runtime before
// bundles/ left it (every script's modules inside desired.json, version 1), which the first change
// then moves into bundles/.
func TestRestartedNodeServesItsWorkersAgainWithTheirSecrets(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		between func(t *testing.T, stateDir string)
	}{
		{"as it left its state directory", func(*testing.T, string) {}},
		{"upgraded over a version-1 state directory", writeVersion1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			const canary = "canary-restart-4411"
			before := f.serveWithSecret("keeper", "uid-k", "k", canary)

			// No Host involved: the node reads its own desired state.
			f.h.RestartAfter(t, func() { tc.between(t, f.h.StateDir) })
			f.reconnect()
			after := f.waitReady("keeper")
			require.Equal(t, before.Incarnation.ID, after.Incarnation.ID, "the same admitted incarnation")
			f.answers("keeper.workers.localhost", expectReply("k", canary))

			f.script("other", "uid-o", 1, "o1")
			desired, err := os.ReadFile(filepath.Join(f.h.StateDir, "desired.json"))
			require.NoError(t, err)
			require.NotContains(t, string(desired), "version=k", "modules left in desired.json after a change")
			bundles, err := os.ReadDir(filepath.Join(f.h.StateDir, "bundles"))
			require.NoError(t, err)
			require.Len(t, bundles, 2, "one bundle for each script's code")
			requireNowhere(t, canary, f.h.StateDir, f.h.Logs.String())
		})
	}
}

func TestCodeChangeKeepsTheDeliveredSecretAndDropsNoRequest(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-update-77aa"
	v1 := f.serveWithSecret("rolling", "uid-r", "v1", canary)

	var ok, failed atomic.Int64
	var lastFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
				req.Host = "rolling.workers.localhost"
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					lastFailure.Store(err.Error())
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.HasSuffix(string(body), fmt.Sprintf("len=%d sha256=%s\n", len(canary), sha(canary))) {
					failed.Add(1)
					lastFailure.Store(fmt.Sprintf("%d %s", resp.StatusCode, body))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	// Traffic flows before the update (a condition, not a pause).
	require.Eventually(t, func() bool { return ok.Load()+failed.Load() >= 10 }, 30*time.Second, 10*time.Millisecond, "requests before the update")
	// A new generation, no second delivery: it runs with the values delivered for this worker UID.
	f.script("rolling", "uid-r", 2, "v2", "TOKEN")
	v2 := f.waitStatus("generation 2 serving", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Generation == 2 && s.Incarnation.Generation == 2
	}, "rolling")
	require.NotEqual(t, v1.Incarnation.ID, v2.Incarnation.ID)
	require.Equal(t, "delivery-rolling", v2.Incarnation.DeliveryID)
	f.answers("rolling.workers.localhost", expectReply("v2", canary))
	// And keeps flowing after the switch, while the incumbent drains.
	switched := ok.Load() + failed.Load()
	require.Eventually(t, func() bool { return ok.Load()+failed.Load() >= switched+10 }, 30*time.Second, 10*time.Millisecond, "requests after the switch")
	close(stop)
	wg.Wait()
	require.Zero(t, failed.Load(), "failed requests across the update (last: %v)", lastFailure.Load())
	require.Greater(t, ok.Load(), int64(20))
	require.Eventually(t, func() bool { return f.h.Node.Stopping("rolling") == 0 }, 15*time.Second, 20*time.Millisecond, "the incumbent drains and leaves its process")
	require.Equal(t, v1.Incarnation.PID, v2.Incarnation.PID, "an update is a new isolate in the same process, not a process start")

	// A candidate that cannot start leaves the incumbent serving.
	broken := f.scriptPut("uid-r", 3, "v3", "TOKEN")
	broken.Modules = map[string]string{"main.js": "export default { fetch( {"}
	_, err := f.client.PutScript(f.ctx, "rolling", broken)
	require.NoError(t, err)
	st := f.waitStatus("candidate failed", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.State == adminapi.StateFailed
	}, "rolling")
	require.False(t, st.Ready)
	require.Equal(t, adminapi.ReasonFailed, st.Reason)
	require.Equal(t, v2.Incarnation.ID, st.Incarnation.ID)
	f.answers("rolling.workers.localhost", expectReply("v2", canary))
	requireNowhere(t, canary, f.h.StateDir, f.h.Logs.String())
}

func TestEffectsAreIdempotentAndGenerationsMoveForward(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	put := f.scriptPut("uid-i", 2, "i")
	first, err := f.client.PutScript(f.ctx, "idem", put)
	require.NoError(t, err)
	again, err := f.client.PutScript(f.ctx, "idem", put)
	require.NoError(t, err)
	require.Equal(t, first.Generation, again.Generation)
	f.waitReady("idem")

	code, _ := f.raw(http.MethodPut, adminapi.ScriptPath("idem"), f.token(), put)
	require.Equal(t, http.StatusOK, code)
	req, _ := http.NewRequest(http.MethodPut, f.h.Info.AdminURL+adminapi.ScriptPath("idem"), strings.NewReader(mustJSON(t, put)))
	req.Header.Set("Authorization", "Bearer "+f.token())
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "true", resp.Header.Get(adminapi.HeaderReplayed))

	conflicting := put
	conflicting.DeploymentID = "dep-other"
	_, err = f.client.PutScript(f.ctx, "idem", conflicting)
	require.True(t, selfhost.IsCode(err, adminapi.CodeEffectConflict), "%v", err)

	older := f.scriptPut("uid-i", 1, "old")
	_, err = f.client.PutScript(f.ctx, "idem", older)
	require.True(t, selfhost.IsCode(err, adminapi.CodeStaleGeneration), "a late older PUT never reverts: %v", err)
	same := f.scriptPut("uid-i", 2, "different")
	_, err = f.client.PutScript(f.ctx, "idem", same)
	require.True(t, selfhost.IsCode(err, adminapi.CodeGenerationConflict), "%v", err)

	// A delete for another worker UID removes nothing and says what is there.
	left, err := f.client.DeleteScript(f.ctx, "idem", "uid-someone-else")
	require.NoError(t, err)
	require.True(t, left.Present)
	require.Equal(t, "uid-i", left.WorkerUID)

	// Deliveries name the script's secrets exactly, and belong to its worker UID.
	_, err = f.client.PutSecrets(f.ctx, "idem", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: "uid-i", DeliveryID: "d", Values: map[string]vocab.Secret{"OTHER": vocab.NewSecret("x")}})
	require.True(t, selfhost.IsCode(err, adminapi.CodeSecretNames), "%v", err)
	_, err = f.client.PutSecrets(f.ctx, "idem", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: "uid-x", DeliveryID: "d", Values: map[string]vocab.Secret{"OTHER": vocab.NewSecret("x")}})
	require.True(t, selfhost.IsCode(err, adminapi.CodeWorkerMismatch), "%v", err)
	_, err = f.client.PutSecrets(f.ctx, "absent", adminapi.SecretsPut{EffectID: f.effect(), WorkerUID: "uid-i", DeliveryID: "d", Values: map[string]vocab.Secret{"A": vocab.NewSecret("x")}})
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptAbsent), "%v", err)

	// Bad input changes nothing.
	bad := f.scriptPut("uid-i", 3, "i")
	bad.MainModule = "missing.js"
	_, err = f.client.PutScript(f.ctx, "idem", bad)
	require.True(t, selfhost.IsCode(err, adminapi.CodeInvalidRequest), "%v", err)
	st, err := f.client.GetScript(f.ctx, "idem")
	require.NoError(t, err)
	require.Equal(t, int64(2), st.Generation)
}

func mustJSON(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}

func TestAdminAPIRefusesWithoutTheToken(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	for _, token := range []string{"", "wrong", f.token() + "x"} {
		code, body := f.raw(http.MethodGet, adminapi.PathStatus, token, nil)
		require.Equal(t, http.StatusUnauthorized, code)
		require.Contains(t, body, adminapi.CodeUnauthorized)
		require.NotContains(t, body, f.token())
	}
	code, _ := f.raw(http.MethodGet, adminapi.PathStatus, f.token(), nil)
	require.Equal(t, http.StatusOK, code)
	info, err := os.Stat(f.h.Info.TokenFile)
	require.NoError(t, err)
	require.Equal(t, safedir.FileMode, info.Mode().Perm())
	require.NotContains(t, f.h.Logs.String(), f.token(), "the admin token is never logged")
}

func TestStartRefusesUnsafeStateDirAndPublicAdminWithoutTLS(t *testing.T) {
	t.Parallel()
	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o755))
	base := runtimetest.Start(t) // holds its state directory
	wd := workerdtest.Binary(t)
	_, err := runtime.Start(runtime.Config{StateDir: open, Workerd: wd})
	var unsafe *safedir.UnsafePathError
	require.ErrorAs(t, err, &unsafe)

	_, err = runtime.Start(runtime.Config{StateDir: filepath.Join(t.TempDir(), "rt"), SealingKeyFile: runtimetest.SealingKeyFile(t), Workerd: wd, AdminListen: "0.0.0.0:0", EdgeListener: newListener(t)})
	require.ErrorContains(t, err, "not loopback")

	_, err = runtime.Start(runtime.Config{StateDir: base.StateDir, Workerd: wd, AdminListener: newListener(t), EdgeListener: newListener(t)})
	require.ErrorContains(t, err, "in use by another runtime node")

	_, err = runtime.Start(runtime.Config{StateDir: filepath.Join(t.TempDir(), "rt2"), Workerd: filepath.Join(t.TempDir(), "no-workerd")})
	require.ErrorContains(t, err, "make workerd")
}

func newListener(t *testing.T) net.Listener {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return l
}

func TestWorkerOutputIsScrubbedOfDeliveredValues(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const canary = "canary-console-5be0"
	put := f.scriptPut("uid-l", 1, "l", "TOKEN")
	put.Modules = map[string]string{"main.js": `export default {
  fetch(req, env) {
    console.log("the token is " + env.TOKEN);
    console.error("again: " + env.TOKEN);
    return new Response("logged\n");
  }
};`}
	_, err := f.client.PutScript(f.ctx, "chatty", put)
	require.NoError(t, err)
	f.route("chatty.workers.localhost", "chatty", "ep-l")
	f.deliver("chatty", "uid-l", "delivery-l", canary)
	f.waitReady("chatty")
	f.answers("chatty.workers.localhost", "logged\n")
	lines := f.workerLines("chatty", "uid-l", func(lines []string) bool { return slices.Contains(lines, "again: [redacted]") })
	require.Contains(t, lines, "the token is [redacted]")
	requireNowhere(t, canary, f.h.StateDir, f.h.Logs.String(), strings.Join(lines, "\n"))
}

// A new revision that declares a secret its delivery does not carry is started (its code is
// checked) but never served: the incumbent keeps answering until a delivery with every declared
// name arrives, and the script reports RuntimeInputPending meanwhile.
func TestNewSecretNamesWaitForTheirDeliveryWhileTheIncumbentServes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "names.workers.localhost"
	f.script("names", "uid-n", 1, "v1", "TOKEN")
	f.route(host, "names", "ep-n")
	f.deliver("names", "uid-n", "delivery-1", "first")
	f.waitReady("names")
	f.answers(host, expectReply("v1", "first"))

	f.script("names", "uid-n", 2, "v2", "EXTRA", "TOKEN")
	st := f.waitStatus("the new revision held for its secrets", func(s adminapi.ScriptStatus) bool {
		return s.Reason == adminapi.ReasonSecretsPending && s.Candidate != nil && s.Candidate.State == adminapi.StateReady
	}, "names")
	require.False(t, st.Ready)
	require.Equal(t, int64(1), st.Incarnation.Generation)
	for range 5 {
		code, body, _ := f.h.Get(t, host, "/")
		require.Equal(t, http.StatusOK, code)
		require.Equal(t, expectReply("v1", "first"), body, "the edge switched to a revision without its secrets")
	}
	// A restart meanwhile changes nothing: the incumbent serves again, the new revision is held.
	f.h.Restart(t)
	f.reconnect()
	f.answers(host, expectReply("v1", "first"))
	f.waitStatus("the new revision held again after the restart", func(s adminapi.ScriptStatus) bool {
		return s.Reason == adminapi.ReasonSecretsPending && s.Candidate != nil && s.Candidate.State == adminapi.StateReady
	}, "names")
	code, body, _ := f.h.Get(t, host, "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, expectReply("v1", "first"), body)

	_, err := f.client.PutSecrets(f.ctx, "names", adminapi.SecretsPut{
		EffectID: f.effect(), WorkerUID: "uid-n", DeliveryID: "delivery-2",
		Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret("second"), "EXTRA": vocab.NewSecret("more")},
	})
	require.NoError(t, err)
	st = f.waitStatus("generation 2 serving with both secrets", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 2
	}, "names")
	require.Equal(t, "delivery-2", st.Incarnation.DeliveryID)
	f.answers(host, expectReply("v2", "second"))
}

// A node restarted while a newer deployment is only a failed candidate serves the incumbent
// again, not nothing: the admitted incarnation's content is kept beside the newer desired one.
func TestRestartedNodeServesTheIncumbentWhileTheNewerDeploymentFails(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "keep.workers.localhost"
	f.script("keep", "uid-k", 1, "v1")
	f.route(host, "keep", "ep-k")
	f.waitReady("keep")
	f.answers(host, expectReply("v1", ""))

	broken := f.scriptPut("uid-k", 2, "v2")
	broken.Modules = map[string]string{"main.js": "export default { fetch( {"}
	_, err := f.client.PutScript(f.ctx, "keep", broken)
	require.NoError(t, err)
	f.waitStatus("candidate failed", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.State == adminapi.StateFailed
	}, "keep")
	f.answers(host, expectReply("v1", ""))

	f.h.Restart(t)
	f.reconnect()
	f.answers(host, expectReply("v1", ""))
	st := f.waitStatus("the newer deployment failed again beside the incumbent", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.State == adminapi.StateFailed
	}, "keep")
	require.Equal(t, int64(1), st.Incarnation.Generation)
	require.Equal(t, adminapi.ReasonFailed, st.Reason)

	// A fixed deployment replaces it as usual, and a restart then serves the fixed one.
	f.script("keep", "uid-k", 3, "v3")
	f.waitStatus("generation 3 serving", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Incarnation.Generation == 3 }, "keep")
	f.answers(host, expectReply("v3", ""))
	f.h.Restart(t)
	f.reconnect()
	f.answers(host, expectReply("v3", ""))
}

// Generations order a script name across worker UIDs: a late PUT from a deleted or replaced worker
// neither revives the script nor overwrites its successor.
func TestLatePutsFromAnEarlierWorkerNeverReviveOrOverwrite(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	stale := func(uid string, gen int64) {
		t.Helper()
		_, err := f.client.PutScript(f.ctx, "late", f.scriptPut(uid, gen, "v"))
		require.True(t, selfhost.IsCode(err, adminapi.CodeStaleGeneration), "%s generation %d: %v", uid, gen, err)
	}
	f.script("late", "uid-a", 5, "a")
	_, err := f.client.DeleteScript(f.ctx, "late", "uid-a")
	require.NoError(t, err)
	f.h.Restart(t) // what the node has moved past survives its restart
	f.reconnect()
	stale("uid-a", 4)
	stale("uid-a", 5)
	stale("uid-b", 3)
	st, err := f.client.GetScript(f.ctx, "late")
	require.NoError(t, err)
	require.False(t, st.Present, "a late PUT revived a deleted script")
	status, err := f.client.Status(f.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(5), status.GenerationFloor, "the status names the generation a deleted script moved the name past")

	f.script("late", "uid-b", 6, "b")
	status, err = f.client.Status(f.ctx)
	require.NoError(t, err)
	require.Equal(t, int64(6), status.GenerationFloor, "and a held script's")
	_, err = f.client.PutScript(f.ctx, "late", f.scriptPut("uid-a", 7, "a"))
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptHeld), "a newer generation of another worker took the script: %v", err)
	st, err = f.client.GetScript(f.ctx, "late")
	require.NoError(t, err)
	require.Equal(t, "uid-b", st.WorkerUID)
	require.Equal(t, int64(6), st.Generation)
}

// The attack of SPEC 3.4 at the node: another organization's worker writes a script name that
// a live worker holds (a v1 collision). Its PUT, delivery and delete are refused or change nothing;
// the holder keeps answering with its own secret, and no answer names the holder.
func TestScriptHeldByOneWorkerIsNeverTakenByAnother(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const victimSecret = "canary-victim-8fQw"
	const script = "victim-prod-82de0c80" // the v1 name both organizations of the vectors derive
	f.script(script, "uid-victim", 1, "victim", "TOKEN")
	f.deliver(script, "uid-victim", "delivery-v", victimSecret)
	f.route("victim.workers.localhost", script, "ep-victim")
	f.waitReady(script)
	f.answers("victim.workers.localhost", expectReply("victim", victimSecret))

	attack := f.scriptPut("uid-attacker", 1_000_000, "attacker")
	attack.Labels.Organization = "org-2"
	_, err := f.client.PutScript(f.ctx, script, attack)
	require.True(t, selfhost.IsCode(err, adminapi.CodeScriptHeld), "another worker's PUT took the script: %v", err)
	require.NotContains(t, err.Error(), "uid-victim", "the refusal names nobody")
	require.NotContains(t, err.Error(), "org-1")

	_, err = f.client.PutSecrets(f.ctx, script, adminapi.SecretsPut{
		EffectID: f.effect(), WorkerUID: "uid-attacker", DeliveryID: "delivery-a", Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret("attacker")},
	})
	require.True(t, selfhost.IsCode(err, adminapi.CodeWorkerMismatch), "%v", err)
	require.NotContains(t, err.Error(), "uid-victim")

	_, err = f.client.DeleteScript(f.ctx, script, "uid-attacker")
	require.NoError(t, err, "a delete of what the caller does not hold is a no-op")

	st, err := f.client.GetScript(f.ctx, script)
	require.NoError(t, err)
	require.Equal(t, "uid-victim", st.WorkerUID)
	require.True(t, st.Ready)
	require.Equal(t, "delivery-v", st.Secrets.DeliveryID, "the holder's delivered secrets are kept")
	f.answers("victim.workers.localhost", expectReply("victim", victimSecret))

	// Once the holder's delete is confirmed the name is free, for a newer generation only.
	_, err = f.client.DeleteScript(f.ctx, script, "uid-victim")
	require.NoError(t, err)
	f.script(script, "uid-attacker", 1_000_001, "attacker")
}

// A readback that concludes a delivery absent refuses that delivery from then on, across a
// restart of the node: a copy still on its way (from a Host killed while sending it, or a call that
// timed out) never lands after the Host failed its lease for not finding it. A readback concluding
// the delivery the script holds refuses nothing.
func TestAReadbackThatFindsADeliveryAbsentRefusesItLater(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	const canary = "canary-late-9c2e"
	f.script("late", "uid-l", 1, "l", "TOKEN")
	challenge := make([]byte, 32)
	_, _ = rand.Read(challenge)

	rb, err := f.client.Readback(f.ctx, "late", challenge, "delivery-late")
	require.NoError(t, err)
	require.False(t, rb.Present)
	f.h.Restart(t)
	f.reconnect()
	_, err = f.client.PutSecrets(f.ctx, "late", adminapi.SecretsPut{
		EffectID: f.effect(), WorkerUID: "uid-l", DeliveryID: "delivery-late", Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret(canary)},
	})
	require.True(t, selfhost.IsCode(err, adminapi.CodeDeliveryRefused), "the late copy is refused: %v", err)
	st, err := f.client.GetScript(f.ctx, "late")
	require.NoError(t, err)
	require.False(t, st.Secrets.Delivered)

	f.deliver("late", "uid-l", "delivery-next", canary)
	rb, err = f.client.Readback(f.ctx, "late", challenge, "delivery-next")
	require.NoError(t, err)
	require.True(t, rb.Present)
	f.waitReady("late")
	requireNowhere(t, canary, f.h.StateDir, f.h.Logs.String())
}

// TestAScriptThatCannotStartIsTriedAgainAfterABackoffNotOnEveryNudge: a new generation whose
// delivery no longer opens (its sealed file is damaged) cannot start a candidate. While another
// script's updates nudge the reconciler again and again, the broken one is tried on a capped
// backoff (a start and a log line each time), not on every nudge; its incumbent keeps serving,
// and a new delivery (the Host asking again) starts it at once.
func TestAScriptThatCannotStartIsTriedAgainAfterABackoffNotOnEveryNudge(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.serveWithSecret("broken", "uid-b", "b1", "canary-backoff-1")
	require.NoError(t, os.WriteFile(filepath.Join(f.h.StateDir, "secrets", "uid-b"), []byte(`{"format":"damaged"}`), 0o600))
	f.script("broken", "uid-b", 2, "b2", "TOKEN")

	// Another script's updates: each start, promotion, drain and stop kicks the reconciler.
	f.churn("busy", "uid-n", 4)
	// attempts are the times the broken generation was tried, from the node's log.
	attempts := func() []time.Time {
		var at []time.Time
		for _, line := range strings.Split(f.h.Logs.String(), "\n") {
			var l struct {
				Time   time.Time `json:"time"`
				Msg    string    `json:"msg"`
				Script string    `json:"script"`
			}
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "start candidate" && l.Script == "broken" {
				at = append(at, l.Time)
			}
		}
		return at
	}
	// The incumbent's own restart kicks the broken script's reconcile inside its backoff.
	st, err := f.client.GetScript(f.ctx, "broken")
	require.NoError(t, err)
	require.NotNil(t, st.Incarnation)
	require.NoError(t, syscall.Kill(st.Incarnation.PID, syscall.SIGKILL))
	// Tried again after its backoff by the node itself (nothing else asks), and never sooner.
	require.Eventually(t, func() bool { return len(attempts()) >= 3 }, 20*time.Second, 50*time.Millisecond,
		"the broken generation was not tried again after its backoff")
	at := attempts()
	for i := 1; i < len(at); i++ {
		require.GreaterOrEqual(t, at[i].Sub(at[i-1]), 900*time.Millisecond, "try %d came %v after the one before, inside the backoff", i+1, at[i].Sub(at[i-1]))
	}
	// The incumbent is still the script's incarnation (its delivery, damaged on disk, no longer
	// opens either: it cannot reload until a new one comes).
	st, err = f.client.GetScript(f.ctx, "broken")
	require.NoError(t, err)
	require.Equal(t, int64(1), st.Incarnation.Generation)

	f.deliver("broken", "uid-b", "delivery-b2", "canary-backoff-2")
	f.waitStatus("the new delivery serving", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 2 && s.Incarnation.DeliveryID == "delivery-b2"
	}, "broken")
	f.answers("broken.workers.localhost", expectReply("b2", "canary-backoff-2"))
}

// A status read with since and wait is held while the script's status stays what the caller
// last read, and answers as soon as it changes: the Host awaits admissions with it.
func TestAScriptStatusLongPollHoldsUntilTheStatusChanges(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	absent, err := f.client.GetScript(f.ctx, "watched")
	require.NoError(t, err)
	require.NotEmpty(t, absent.Version)

	start := time.Now()
	same, err := f.client.WatchScript(f.ctx, "watched", absent.Version, 300*time.Millisecond)
	require.NoError(t, err)
	require.Equal(t, absent.Version, same.Version, "nothing changed, yet the version did")
	require.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond, "the read was not held for its wait")
	require.Zero(t, f.h.Node.PollsWaiting(), "a poll that ended, and plain reads, left a channel behind")

	// A poll held from before a PUT answers with the script present, long before its wait ends.
	// watched starts a poll and returns once its request is written, so that a change made next
	// reaches the node after it.
	watched := func(since string) <-chan watchAnswer {
		got, written, start := make(chan watchAnswer, 1), make(chan struct{}), time.Now()
		var once sync.Once
		wrote := func() { once.Do(func() { close(written) }) }
		ctx := httptrace.WithClientTrace(f.ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote() }})
		go func() {
			st, err := f.client.WatchScript(ctx, "watched", since, adminapi.StatusWaitMax)
			got <- watchAnswer{st, err, time.Since(start)}
			wrote() // a request that failed before it was written
		}()
		<-written
		return got
	}
	got := watched(absent.Version)
	f.script("watched", "uid-w", 1, "v1")
	a := <-got
	require.NoError(t, a.err)
	require.True(t, a.st.Present)
	require.NotEqual(t, absent.Version, a.st.Version)
	require.Less(t, a.in, adminapi.StatusWaitMax/2, "the poll was not woken by the change")

	// Long polls alone follow the incarnation to Ready: each answer is a new version, and comes
	// when the status changes, not when the wait ends.
	st := a.st
	for !st.Ready {
		a := <-watched(st.Version)
		require.NoError(t, a.err)
		require.NotEqual(t, st.Version, a.st.Version, "a long poll answered an unchanged status after its whole wait")
		require.Less(t, a.in, adminapi.StatusWaitMax, "a long poll was answered by its wait's end, not by the change")
		st = a.st
	}

	// A new deployment of the same code is the same incarnation: nothing starts, so nothing
	// kicks the reconciler, and the PUT itself wakes the poll.
	got = watched(st.Version)
	f.script("watched", "uid-w", 2, "v1")
	a = <-got
	require.NoError(t, a.err)
	require.EqualValues(t, 2, a.st.Generation)
	require.Less(t, a.in, adminapi.StatusWaitMax/2, "the PUT of a new generation did not wake the poll")
}

// watchAnswer is one long poll's answer and how long it took.
type watchAnswer struct {
	st  adminapi.ScriptStatus
	err error
	in  time.Duration
}

// What other tenants do on a node costs a serving script nothing: another script's deploys (each
// start, promotion, drain and stop kicks the reconciler) reconcile only that script and wake only
// its status long polls, and reads of a status use the identity its last reconcile rendered. Before, every kick reconciled every
// script of the node, with n.mu held for writing (the edge waits on it), and every status read
// rendered the script's workerd config and digested its bundle again: about 20 ms for a 1 MiB
// bundle, for each script at each kick and each waiter at each wake.
func TestAnotherScriptsChurnAndStatusReadsCostAServingScriptNothing(t *testing.T) {
	t.Parallel()
	// No liveness probes during the test: a probe's outcome is a change of the quiet script's own.
	f, _ := setupWithoutWorkerd(t, func(c *runtime.Config) { c.LivenessPeriod = time.Hour })
	f.script("quiet", "uid-q", 1, "q1")
	f.waitReady("quiet")
	// Ready is reported before the reconcile that follows its own promotion may have run: wait
	// until the quiet script's own work has settled, so that only the other script's churn counts.
	var reconciles int
	var renders int64
	require.Eventually(t, func() bool {
		r1, n1 := f.h.Node.ScriptWork("quiet")
		time.Sleep(500 * time.Millisecond)
		reconciles, renders = f.h.Node.ScriptWork("quiet")
		return r1 == reconciles && n1 == renders
	}, 10*time.Second, 10*time.Millisecond)
	require.Positive(t, reconciles)
	require.Positive(t, renders)
	// A status long poll of the quiet script is held through all of it.
	quiet, err := f.client.GetScript(f.ctx, "quiet")
	require.NoError(t, err)
	polled, written := make(chan watchAnswer, 1), make(chan struct{})
	var once sync.Once
	wrote := func() { once.Do(func() { close(written) }) }
	go func() {
		ctx := httptrace.WithClientTrace(f.ctx, &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { wrote() }})
		start := time.Now()
		st, err := f.client.WatchScript(ctx, "quiet", quiet.Version, adminapi.StatusWaitMax)
		polled <- watchAnswer{st, err, time.Since(start)}
		wrote() // a request that failed before it was written
	}()
	<-written

	f.churn("busy", "uid-n", 3)
	for range 10 {
		_, err := f.client.GetScript(f.ctx, "quiet")
		require.NoError(t, err)
		_, err = f.client.Status(f.ctx)
		require.NoError(t, err)
	}
	r, n := f.h.Node.ScriptWork("quiet")
	require.Equal(t, reconciles, r, "another script's churn reconciled this one")
	require.Equal(t, renders, n, "status reads rendered this script's identity again")
	require.Zero(t, f.h.Node.StatusWakes(), "another script's churn woke the quiet script's long poll")
	// Its own change wakes it at once.
	f.script("quiet", "uid-q", 2, "q2")
	a := <-polled
	require.NoError(t, a.err)
	require.NotEqual(t, quiet.Version, a.st.Version)
	require.Less(t, a.in, adminapi.StatusWaitMax, "the quiet script's own change did not wake its long poll")
	f.waitStatus("quiet serving generation 2", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 2 && s.Candidate == nil
	}, "quiet")

	// The busy script's own reads, once it settled, render nothing either.
	f.waitStatus("busy's earlier incarnations stopped", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Candidate == nil
	}, "busy")
	_, before := f.h.Node.ScriptWork("busy")
	for range 10 {
		_, err := f.client.GetScript(f.ctx, "busy")
		require.NoError(t, err)
	}
	_, after := f.h.Node.ScriptWork("busy")
	require.Equal(t, before, after, "status reads of a settled script rendered its identity")
}

// writeVersion1 rewrites a stopped node's state directory as the runtime before bundles/ left it:
// each script's (and admitted incumbent's) modules inline in desired.json, version 1.
func writeVersion1(t *testing.T, stateDir string) {
	t.Helper()
	path := filepath.Join(stateDir, "desired.json")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var d map[string]any
	require.NoError(t, json.Unmarshal(b, &d))
	// The saves since desired.json are in its journal: version 1 had none, so they go in.
	if name, _ := d["journal"].(string); name != "" {
		journal, err := os.ReadFile(filepath.Join(stateDir, name))
		if err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(journal)), "\n") {
				var changes map[string]any
				require.NoError(t, json.Unmarshal([]byte(line), &changes))
				for field, v := range changes {
					m, ok := v.(map[string]any)
					if !ok {
						d[field] = v // brakes: all of them
						continue
					}
					into, _ := d[field].(map[string]any)
					if into == nil {
						into = map[string]any{}
						d[field] = into
					}
					for k, entry := range m {
						if entry == nil {
							delete(into, k)
						} else {
							into[k] = entry
						}
					}
				}
			}
		}
		delete(d, "journal")
		if err := os.Remove(filepath.Join(stateDir, name)); !errors.Is(err, fs.ErrNotExist) {
			require.NoError(t, err)
		}
	}
	inline := func(entry map[string]any) {
		ref, _ := entry["modulesRef"].(string)
		require.NotEmpty(t, ref)
		m, err := os.ReadFile(filepath.Join(stateDir, "bundles", ref))
		require.NoError(t, err)
		var modules map[string]string
		require.NoError(t, json.Unmarshal(m, &modules))
		entry["modules"] = modules
		delete(entry, "modulesRef")
	}
	for _, v := range d["scripts"].(map[string]any) {
		script := v.(map[string]any)
		inline(script)
		if serving, ok := script["serving"].(map[string]any); ok {
			inline(serving)
		}
	}
	d["version"] = 1
	b, err = json.Marshal(d)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.NoError(t, os.RemoveAll(filepath.Join(stateDir, "bundles")))
}

// copyStateV2 copies testdata/state-v2 (a state directory the release before org processes left,
// see testdata/README.md) and its sealing key into a fresh place, with the modes the node
// requires (SPEC 6.3), and returns the state directory and the key file.
func copyStateV2(t *testing.T) (stateDir, keyFile string) {
	t.Helper()
	base := t.TempDir()
	stateDir = filepath.Join(base, "runtime")
	require.NoError(t, filepath.WalkDir(filepath.Join("testdata", "state-v2"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(filepath.Join("testdata", "state-v2"), path)
		to := filepath.Join(stateDir, rel)
		if d.IsDir() {
			return os.Mkdir(to, 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o600)
	}))
	require.NoError(t, os.Mkdir(filepath.Join(base, "keys"), 0o700))
	keyFile = filepath.Join(base, "keys", "sealing-key")
	key, err := os.ReadFile(filepath.Join("testdata", "state-v2.sealing-key"))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(keyFile, key, 0o600))
	return stateDir, keyFile
}

// A node upgraded over a state directory of the process-per-incarnation release moves its workers
// into org processes through the update path (SPEC 5): each admitted incarnation serves at once
// under its new identity, with its secret, from the node's first answer on; a newer generation
// that had failed stays a candidate beside its incumbent; and the state is saved in the new
// version.
func TestANodeOfTheProcessPerIncarnationModelMovesItsWorkersIntoOrgProcesses(t *testing.T) {
	t.Parallel()
	stateDir, keyFile := copyStateV2(t)
	edgeL := newListener(t)
	// Clients are already calling when the node starts: their connections wait in the
	// listener's queue, and every one must be answered by its worker.
	type answer struct {
		host, body string
		code       int
		err        error
	}
	answers := make(chan answer, 64)
	want := map[string]string{"a.upgrade.test": "upgraded-a sha256=" + sha("canary-upgrade-5Ze9") + "\n", "b.upgrade.test": "upgraded-b v1\n"}
	var wg sync.WaitGroup
	for host := range want {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				req, _ := http.NewRequest(http.MethodGet, "http://"+edgeL.Addr().String()+"/", nil)
				req.Host = host
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				a := answer{host: host, err: err}
				if err == nil {
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					a.code, a.body = resp.StatusCode, string(b)
				}
				answers <- a
			}
		}()
	}
	f := setup(t, func(c *runtime.Config) { c.StateDir, c.SealingKeyFile, c.EdgeListener = stateDir, keyFile, edgeL })
	wg.Wait()
	close(answers)
	for a := range answers {
		require.NoError(t, a.err, a.host)
		require.Equal(t, http.StatusOK, a.code, "%s: %s", a.host, a.body)
		require.Equal(t, want[a.host], a.body)
	}

	var d struct {
		Version int `json:"version"`
		Scripts map[string]struct {
			Admitted string `json:"admitted"`
		} `json:"scripts"`
	}
	b, err := os.ReadFile(filepath.Join(stateDir, "desired.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &d))
	require.Equal(t, 4, d.Version, "saved in the current version")
	a := f.waitReady("acme-a")
	// globex-b is not Ready: its desired generation 2 failed, while generation 1 serves.
	b2 := f.waitStatus("globex-b's incumbent serving, its newer generation failed", func(s adminapi.ScriptStatus) bool {
		return s.Incarnation != nil && s.Incarnation.State == adminapi.StateReady && s.Candidate != nil && s.Candidate.State == adminapi.StateFailed
	}, "globex-b")
	require.Equal(t, int64(2), b2.Generation)
	require.Equal(t, int64(1), b2.Incarnation.Generation, "the incumbent serves")
	for name, st := range map[string]adminapi.ScriptStatus{"acme-a": a, "globex-b": b2} {
		old := map[string]string{"acme-a": "inc-6b4b6bf2da465bba742bdf09090524ad", "globex-b": "inc-df2f79a3cfc0c69996bbabb75aaabce1"}[name]
		require.NotEqual(t, old, st.Incarnation.ID, "%s is admitted under its isolate identity", name)
		require.Equal(t, st.Incarnation.ID, d.Scripts[name].Admitted)
	}
	_, err = os.Stat(filepath.Join(stateDir, "incarnations"))
	require.ErrorIs(t, err, fs.ErrNotExist, "the earlier runtime's incarnation directories are gone")
	requireNowhere(t, "canary-upgrade-5Ze9", stateDir, f.h.Logs.String())
}

// pss is the proportional memory (KiB) of a process and every process below it.
func pss(t *testing.T, pid int) int64 {
	t.Helper()
	var total int64
	for _, p := range append(descendants(t, pid), pid) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", p))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "Pss:" {
				kib, _ := strconv.ParseInt(f[1], 10, 64)
				total += kib
			}
		}
	}
	return total
}

// A worker updated 200 times under load drops no request, and its organization's process, which
// holds every retired version's isolate (workerd never frees one), is recycled as they pile up:
// a fresh process loads the live version, the edge switches, the old one drains. Its memory comes
// back near where it started instead of growing by every version (SPEC 5: recycling).
func TestAWorkerUpdated200TimesUnderLoadDropsNothingAndItsProcessIsRecycled(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "updated.workers.localhost"
	first := f.serveWithSecret("updated", "uid-u", "u1", "canary-recycle-9d2")
	time.Sleep(time.Second) // settled: what is measured is the process at rest
	before := pss(t, first.Incarnation.PID)

	var ok, failed atomic.Int64
	var lastFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodGet, "http://"+f.h.Info.EdgeAddr+"/", nil)
				req.Host = host
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					lastFailure.Store(err.Error())
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(body), "version=u") {
					failed.Add(1)
					lastFailure.Store(fmt.Sprintf("%d %s", resp.StatusCode, body))
					continue
				}
				ok.Add(1)
			}
		}()
	}
	pids := map[int]bool{first.Incarnation.PID: true}
	for gen := int64(2); gen <= 201; gen++ {
		f.script("updated", "uid-u", gen, fmt.Sprintf("u%d", gen), "TOKEN")
		st := f.waitStatus("the new version serving", func(s adminapi.ScriptStatus) bool {
			return s.Ready && s.Incarnation.Generation == gen
		}, "updated")
		pids[st.Incarnation.PID] = true
	}
	close(stop)
	wg.Wait()
	require.Zero(t, failed.Load(), "failed requests across 200 updates (last: %v)", lastFailure.Load())
	require.Greater(t, ok.Load(), int64(200))
	require.GreaterOrEqual(t, len(pids), 5, "the process was recycled as retired versions piled up")

	f.answers(host, expectReply("u201", "canary-recycle-9d2"))
	last, err := f.client.GetScript(f.ctx, "updated")
	require.NoError(t, err)
	time.Sleep(time.Second)
	after := pss(t, last.Incarnation.PID)
	t.Logf("the process's memory: %d MiB at the first version, %d MiB after 200 updates (%d processes in all)", before>>10, after>>10, len(pids))
	// The last process may legitimately hold up to 15 retired isolates (a process recycles at 16)
	// at up to 4 MiB each under load: 60 MiB, and 20 of slack. Without recycling, 200 retired
	// isolates hold about 300 MiB more. (48 MiB was too tight: 49 MiB was measured once in CI.)
	require.Less(t, after, before+80<<10, "the retired versions' memory was given back")
}

// The edge measures each organization's answers by status class and their time, so that an
// operator sees which tenant's workers fail or slow down (issue 34 item 5); a host no worker is
// routed at is counted by status alone, under no organization.
func TestTheEdgeMeasuresEachOrganizationsAnswers(t *testing.T) {
	t.Parallel()
	f, _ := setupWithoutWorkerd(t)
	f.script("app", "uid-a", 1, "a1")
	f.waitReady("app")
	f.route("app.example.test", "app", "ep-a")
	require.Eventually(t, func() bool {
		code, _, _, err := f.h.TryGet("app.example.test", "/")
		return err == nil && code == http.StatusOK
	}, 30*time.Second, 20*time.Millisecond)
	for range 3 {
		code, _, _, err := f.h.TryGet("app.example.test", "/")
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code)
	}
	code, _, _, err := f.h.TryGet("nobody.example.test", "/")
	require.NoError(t, err)
	require.Equal(t, http.StatusNotFound, code)
	m := f.metrics()
	require.Regexp(t, `takoform_runtime_edge_organization_requests_total\{class="2xx",organization="org-1"\} ([4-9]|\d\d+)\n`, m)
	require.Contains(t, m, `takoform_runtime_edge_organization_request_duration_seconds_count{organization="org-1"}`)
	require.Contains(t, m, `takoform_runtime_edge_organization_requests_total{class="4xx",organization="org-1"} 0`, "the unknown host is no organization's")
}
