package runtime_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

const (
	calleeUID  = "0b9c6f1e-2f53-4d8e-9a3c-000000000001"
	callerUID  = "0b9c6f1e-2f53-4d8e-9a3c-000000000002"
	foreignUID = "0b9c6f1e-2f53-4d8e-9a3c-000000000003"
	spyUID     = "0b9c6f1e-2f53-4d8e-9a3c-000000000004"
)

// callerSource answers with what its AUTH binding answered.
const callerSource = `export default {
  async fetch(req, env) {
    const r = await env.AUTH.fetch("http://auth.internal/who");
    return new Response("via binding " + r.status + ": " + (await r.text()));
  }
};`

func (f *fixture) caller(name, uid, org string, generation int64, bindings map[string]string) adminapi.ScriptStatus {
	f.t.Helper()
	p := f.scriptPut(uid, generation, "caller")
	p.Labels.Organization = org
	p.Modules = map[string]string{"main.js": callerSource}
	p.Settings = workerconf.Settings{ServiceBindings: bindings}
	st, err := f.client.PutScript(f.ctx, name, p)
	require.NoError(f.t, err)
	return st
}

// A service binding reaches the callee's current Ready incarnation through the node (SPEC 3.6,
// 5.1): the callee's code update reaches the caller without restarting it, and a binding to
// another organization's worker reaches nothing.
func TestAServiceBindingReachesTheCalleesCurrentIncarnationWithoutRestartingTheCaller(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("callee", calleeUID, 1, "v1")
	f.waitReady("callee")
	f.caller("caller", callerUID, "org-1", 1, map[string]string{"AUTH": calleeUID})
	before := f.waitReady("caller")
	f.route("caller.test", "caller", "ep-caller")
	f.answers("caller.test", "via binding 200: "+expectReply("v1", ""))

	f.script("callee", calleeUID, 2, "v2")
	f.waitStatus("callee at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "callee")
	f.answers("caller.test", "via binding 200: "+expectReply("v2", ""))
	after, err := f.client.GetScript(f.ctx, "caller")
	require.NoError(t, err)
	require.Equal(t, before.Incarnation.ID, after.Incarnation.ID, "the caller runs the same incarnation")
	require.Equal(t, before.Incarnation.PID, after.Incarnation.PID, "the caller's process was not restarted")

	// Another organization's worker on the same node: the node will not route to it, whatever
	// the Host let through.
	foreign := f.scriptPut(foreignUID, 1, "secret")
	foreign.Labels.Organization = "org-2"
	_, err = f.client.PutScript(f.ctx, "foreign", foreign)
	require.NoError(t, err)
	f.waitReady("foreign")
	f.caller("spy", spyUID, "org-1", 1, map[string]string{"AUTH": foreignUID})
	f.waitReady("spy")
	f.route("spy.test", "spy", "ep-spy")
	code, body, _ := f.h.Get(t, "spy.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, "via binding 503: "), "got %q", body)
	require.NotContains(t, body, "version=secret")

	// The binding changed to another worker is taken in place, and a binding whose callee is
	// gone answers 503 at once.
	f.caller("caller", callerUID, "org-1", 2, map[string]string{"AUTH": foreignUID})
	f.waitStatus("caller at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "caller")
	code, body, _ = f.h.Get(t, "caller.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.True(t, strings.HasPrefix(body, "via binding 503: "), "got %q", body)
}

// Each serving incarnation resolves its bindings with its own map (SPEC 3.6): a newer deployment
// that renames the binding and is held (it declares a secret not delivered yet) leaves the
// version still serving reaching its callee through the name it was built with.
func TestTheServingVersionKeepsItsOwnBindingsWhileANewerOneIsHeld(t *testing.T) {
	t.Parallel()
	f := setup(t)
	f.script("callee", calleeUID, 1, "v1")
	f.waitReady("callee")
	f.caller("caller", callerUID, "org-1", 1, map[string]string{"AUTH": calleeUID})
	v1 := f.waitReady("caller")
	f.route("caller.test", "caller", "ep-caller")
	f.answers("caller.test", "via binding 200: "+expectReply("v1", ""))

	p := f.scriptPut(callerUID, 2, "caller", "TOKEN")
	p.Modules = map[string]string{"main.js": strings.ReplaceAll(callerSource, "env.AUTH.", "env.AUTH2.")}
	p.Settings = workerconf.Settings{ServiceBindings: map[string]string{"AUTH2": calleeUID}}
	_, err := f.client.PutScript(f.ctx, "caller", p)
	require.NoError(t, err)
	st := f.waitStatus("caller's generation 2 held for its secret", func(s adminapi.ScriptStatus) bool {
		return s.Candidate != nil && s.Candidate.Generation == 2 && s.Candidate.State == adminapi.StateReady
	}, "caller")
	require.Equal(t, v1.Incarnation.ID, st.Incarnation.ID, "generation 1 still serves")
	code, body, _ := f.h.Get(t, "caller.test", "/")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "via binding 200: "+expectReply("v1", ""), body)
}

// A worker's limits.cpuMs bounds each request's wall time at the edge: past it, 504.
func TestAWorkersCPUMsLimitEndsItsRequestWith504(t *testing.T) {
	t.Parallel()
	f := setup(t)
	p := f.scriptPut(calleeUID, 1, "slow")
	p.Modules = map[string]string{"main.js": `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/slow") await new Promise(r => setTimeout(r, 3000));
    return new Response("done");
  }
};`}
	p.Settings = workerconf.Settings{Limits: &workerconf.Limits{CPUMs: 500}}
	_, err := f.client.PutScript(f.ctx, "slow", p)
	require.NoError(t, err)
	f.waitReady("slow")
	f.route("slow.test", "slow", "ep-slow")
	f.answers("slow.test", "done")
	start := time.Now()
	code, body, _ := f.h.Get(t, "slow.test", "/slow")
	require.Equal(t, http.StatusGatewayTimeout, code, "body: %s", body)
	require.Less(t, time.Since(start), 2500*time.Millisecond)

	// Raised in place: the same request now finishes.
	p = f.scriptPut(calleeUID, 2, "slow")
	p.Modules["main.js"] = `export default {
  async fetch(req) {
    if (new URL(req.url).pathname === "/slow") await new Promise(r => setTimeout(r, 3000));
    return new Response("done");
  }
};`
	p.Settings = workerconf.Settings{Limits: &workerconf.Limits{CPUMs: 10000}}
	_, err = f.client.PutScript(f.ctx, "slow", p)
	require.NoError(t, err)
	f.waitStatus("slow at generation 2", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == 2 }, "slow")
	code, body, _ = f.h.Get(t, "slow.test", "/slow")
	require.Equal(t, http.StatusOK, code, "body: %s", body)
	require.Equal(t, "done", body)
}

// growSource allocates (and touches) 96 MiB on /grow.
const growSource = `const kept = [];
export default {
  async fetch(req) {
    if (new URL(req.url).pathname !== "/grow") return new Response("small");
    for (let i = 0; i < 6; i++) kept.push(new Uint8Array(16 << 20).fill(1));
    return new Response("allocated 96 MiB");
  }
};`

// A worker's limits.memoryMb is its incarnation's cgroup ceiling: 96 MiB kill it at 64, and
// fit once the limit is 200 (a new incarnation, the node's 256 MiB still above it).
func TestAWorkersMemoryLimitIsItsIncarnationsCeiling(t *testing.T) {
	t.Parallel()
	f := setup(t)
	put := func(generation int64, mb int64) {
		p := f.scriptPut(calleeUID, generation, "grow")
		p.Labels.Organization = "grower"
		p.Modules = map[string]string{"main.js": growSource}
		p.Settings = workerconf.Settings{Limits: &workerconf.Limits{MemoryMB: mb}}
		_, err := f.client.PutScript(f.ctx, "grow", p)
		require.NoError(t, err)
		f.waitStatus("grow Ready", func(s adminapi.ScriptStatus) bool { return s.Ready && s.Generation == generation }, "grow")
	}
	put(1, 64)
	f.route("grow.test", "grow", "ep-grow")
	f.answers("grow.test", "small")
	code, body, _ := f.h.Get(t, "grow.test", "/grow")
	require.GreaterOrEqual(t, code, 500, "96 MiB do not fit in 64: %d %s", code, body)
	require.Eventually(t, func() bool { return strings.Contains(f.h.Logs.String(), "killed at its memory ceiling (64 MiB)") }, 10*time.Second, 50*time.Millisecond)

	put(2, 200)
	f.answers("grow.test", "small")
	code, body, _ = f.h.Get(t, "grow.test", "/grow")
	require.Equal(t, http.StatusOK, code, "body: %s", body)
	require.Equal(t, "allocated 96 MiB", body)
}
