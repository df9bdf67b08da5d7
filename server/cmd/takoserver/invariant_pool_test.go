package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/selfhost"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// The custody invariant on a pool of three runtime nodes (SPEC 6.2): the sequences of
// TestCustodyInvariantUnderRandomSequences, with the selfhost installation a pool that starts with
// three members and loses nodes mid-sequence. A member is killed (SIGKILL: its machine is gone),
// some steps run while it is silent, and then it is either started again on its disk or retired as
// lost (`nodes retire --lost`) and a new node added in its place (`nodes add`); a retired node is
// also started again on its disk, where it must serve nothing. Every check of the sequence holds on
// every member whose process runs (each route its holds is its endpoint's organization's, each
// script its live worker's, each delivery dispatched to that worker, a worker read Ready held on
// every member of the Ready set), and at the end every member holds the same workers and routes.

// memberState is what a pooled sequence did to a member.
type memberState int

const (
	memberUp      memberState = iota // a member whose process runs
	memberDown                       // a member whose process was killed: still a member
	memberRetired                    // retired as lost; its process is gone for good
	memberBack                       // retired as lost, then started again on its disk
	memberCut                        // running and serving, its admin API cut off from the Hosts
)

// member is one node of a pooled sequence, which the Hosts reach through its own proxy (so that a
// delivery to it can be held).
type member struct {
	name  string
	n     node
	admin *heldAdmin
	state memberState
	// serving is when a check first read the member serving in the pool's rows.
	serving time.Time
}

// promotedGrace is how long after a member is first read serving it may still lack a worker that
// reads Ready: a Host replica restarted in the seconds before the promotion holds the member
// unsettled for nodepool.CacheTTL by its own clock (it cannot know how long ago the member
// joined), writes it nothing meanwhile and leaves it out of Ready; the reconciler writes it within
// a sweep. A known window, kept out of the Ready check only.
const promotedGrace = 2 * nodepool.CacheTTL

// runtimeView is what one runtime node held at a check.
type runtimeView struct {
	name string
	n    node
	st   adminapi.Status
	// readySet: a serving member whose process runs, so a worker read Ready holds its script there.
	readySet bool
	// retired: a node retired as lost and started again; whatever it holds, it serves nothing.
	retired bool
}

func TestCustodyInvariantOnAPoolOfThreeNodes(t *testing.T) {
	t.Parallel()
	steps := 100
	var until time.Time
	if d, err := time.ParseDuration(os.Getenv("TAKOFORM_SOAK")); err == nil && d > 0 {
		until = time.Now().Add(d)
	}
	for n := 0; n == 0 || time.Now().Before(until); n++ {
		seed := *invariantSeed + uint64(n)
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			w := runSequence(t, "TestCustodyInvariantOnAPoolOfThreeNodes", seed, steps, true)
			t.Logf("custody invariant held on a pool over %d steps: %+v", w.steps, w.progress)
		})
		if t.Failed() {
			return
		}
	}
}

// runtimeViews reads every runtime node whose process runs: the sequence's one node, or each
// member of its pool that is up or back from retirement. The pool's states are read first, so a
// member read serving was caught up before its status was read.
func (w *world) runtimeViews() []runtimeView {
	w.t.Helper()
	ctx := context.Background()
	status := func(n node) adminapi.Status {
		c, err := selfhost.New(n.adminURL, n.tokenFile)
		require.NoError(w.t, err)
		st, err := c.Status(ctx)
		require.NoError(w.t, err)
		return st
	}
	if w.members == nil {
		return []runtimeView{{name: "node", n: w.node, st: status(w.node), readySet: true}}
	}
	states := map[string]string{}
	rows, err := w.db.Query(ctx, `SELECT name, state::text FROM runtime_nodes WHERE installation = 'selfhost'`)
	require.NoError(w.t, err)
	for rows.Next() {
		var name, state string
		require.NoError(w.t, rows.Scan(&name, &state))
		states[name] = state
	}
	require.NoError(w.t, rows.Err())
	var views []runtimeView
	for _, m := range w.members {
		if states[m.name] == "serving" && m.serving.IsZero() {
			m.serving = time.Now()
		}
		if m.state == memberUp || m.state == memberBack || m.state == memberCut {
			views = append(views, runtimeView{name: m.name, n: m.n, st: status(m.n),
				readySet: m.state == memberUp && states[m.name] == "serving" && (m.name == "node-1" || time.Since(m.serving) >= promotedGrace),
				retired:  m.state == memberBack})
		}
	}
	return views
}

// nodeProxies are the proxies in front of the nodes a delivery may reach now.
func (w *world) nodeProxies() []*heldAdmin {
	if w.members == nil {
		return []*heldAdmin{w.admin}
	}
	var out []*heldAdmin
	for _, m := range w.members {
		if m.state == memberUp {
			out = append(out, m.admin)
		}
	}
	return out
}

// checkServesNothing fails when the retired node v's edge answers for hostname.
func (w *world) checkServesNothing(v runtimeView, hostname string) {
	w.t.Helper()
	if code, body := edgeGet(w.t, v.n.edgeAddr, hostname); code != http.StatusServiceUnavailable {
		w.fail("runtime %s, retired as lost and started again, answers %d for %s: %.200s", v.name, code, hostname, body)
	}
}

// addMember starts an empty node and adds it to the pool, as an operator does on a new machine.
func (w *world) addMember() {
	w.t.Helper()
	n := startMemberOf(w.t, w.node, "127.0.0.1:0")
	m := &member{name: fmt.Sprintf("node-%d", len(w.members)+1), n: n, admin: holdAdmin(w.t, n.adminURL)}
	run(w.t, w.dbURL, "nodes", "add", m.name, "--url", m.admin.url, "--config", w.catalog, "--installation", "selfhost")
	w.members = append(w.members, m)
	w.progress.nodeAdds++
	w.log = append(w.log, "node added: "+m.name)
}

// stopNode kills n's process (SIGKILL).
func (w *world) stopNode(n node) {
	w.t.Helper()
	require.NoError(w.t, n.cmd.Process.Signal(syscall.SIGKILL))
	_ = n.cmd.Wait()
}

// startAgain starts m's node again on its disk, at its admin address.
func (w *world) startAgain(m *member) {
	w.t.Helper()
	admin, err := url.Parse(m.n.adminURL)
	require.NoError(w.t, err)
	m.n = startPooledRuntimeAt(w.t, m.n.stateDir, m.n.sealingKeyFile, m.n.poolKeyFile, nil, admin.Host, "127.0.0.1:0")
}

// loseNode loses one member while another stays up, runs one to three steps while it is silent
// (each checked), and then brings it back or replaces it. Now and then (not with retire) the
// member is partitioned: its admin API is cut off from the Hosts while it runs and its edge
// serves, and then the cut heals. Otherwise it is killed, and then started again on its disk, or
// (retire) retired as lost and a node added in its place; with back, the retired node is then
// started again on its disk (one such node runs at a time). It answers false when no member could
// be lost.
func (w *world) loseNode(retire, back bool) bool {
	w.t.Helper()
	var up []*member
	for _, m := range w.members {
		if m.state == memberUp {
			up = append(up, m)
		}
	}
	if len(up) < 2 || w.losing {
		return false
	}
	w.losing = true
	defer func() { w.losing = false }()
	m := up[w.pick(len(up))]
	if !retire && w.pick(3) == 0 {
		m.admin.cut.Store(true)
		m.state = memberCut
		w.progress.partitions++
		w.whileSilent("node cut off from the Hosts: "+m.name, 2, 4)
		m.admin.cut.Store(false)
		m.state = memberUp
		w.log = append(w.log, "node reachable again: "+m.name)
		w.check()
		return true
	}
	w.stopNode(m.n)
	m.state = memberDown
	w.progress.nodeKills++
	w.whileSilent("node killed: "+m.name, 1, 3)
	if !retire {
		w.startAgain(m)
		m.state = memberUp
		w.progress.nodeRestarts++
		w.log = append(w.log, "node started again on its disk: "+m.name)
		w.check()
		return true
	}
	run(w.t, w.dbURL, "nodes", "retire", "--lost", m.name, "--fenced-since", time.Now().Add(-time.Minute).UTC().Format(time.RFC3339),
		"--by", "invariant@example.test", "--config", w.catalog, "--installation", "selfhost")
	m.state = memberRetired
	w.progress.nodeRetires++
	w.log = append(w.log, "node retired as lost: "+m.name)
	w.check()
	w.addMember()
	if back {
		for _, o := range w.members {
			if o.state == memberBack {
				w.stopNode(o.n)
				o.state = memberRetired
			}
		}
		w.startAgain(m)
		m.state = memberBack
		w.progress.nodesBack++
		w.log = append(w.log, "retired node started again on its disk: "+m.name)
	}
	w.check()
	return true
}

// whileSilent logs what befell a member, checks, and runs least to least+spread-1 steps while
// the member is silent.
func (w *world) whileSilent(event string, least, spread int) {
	w.t.Helper()
	w.log = append(w.log, event)
	w.check()
	for range least + w.pick(spread) {
		w.step()
	}
}

// finishPool asserts that the pooled sequence lost nodes each way, and that its members converge:
// every member whose process runs comes to hold what the ledger says every node must hold (each
// live worker's active current deployment, each live endpoint's route: what the node reconciler
// writes), once the Hosts' reconcilers have caught up.
func (w *world) finishPool() {
	w.t.Helper()
	ctx := context.Background()
	p := w.progress
	if p.nodeKills < 1 || p.nodeRestarts+p.partitions < 1 || p.nodeRetires < 1 || p.nodesBack < 1 {
		w.fail("the pool lost too few nodes: %d killed, %d started again, %d retired, %d retired started again",
			p.nodeKills, p.nodeRestarts, p.nodeRetires, p.nodesBack)
	}
	var missing []string
	converged := func() bool {
		current, err := dbsqlc.New(w.db).ReconcileCurrent(ctx, "selfhost")
		require.NoError(w.t, err)
		missing = nil
		for _, v := range w.runtimeViews() {
			if v.retired {
				continue
			}
			scripts, routes := map[string]string{}, map[string]string{}
			for _, s := range v.st.Scripts {
				if s.Present {
					scripts[s.ScriptName] = s.WorkerUID
				}
			}
			for _, r := range v.st.Routes {
				if r.Present {
					routes[r.Hostname] = r.EndpointUID
				}
			}
			for _, c := range current {
				held := scripts
				if c.ResourceKind == dbsqlc.ResourceKindWorkerEndpoint {
					held = routes
				}
				if held[c.NativeName] != c.ResourceUID.String() {
					missing = append(missing, fmt.Sprintf("%s lacks %s %s of %s", v.name, c.ResourceKind, c.NativeName, c.ResourceUID))
				}
			}
		}
		return len(missing) == 0
	}
	deadline := time.Now().Add(90 * time.Second)
	for !converged() {
		if time.Now().After(deadline) {
			w.fail("the pool's members never came to hold what the ledger says each must hold: %s", strings.Join(missing, "; "))
		}
		time.Sleep(500 * time.Millisecond)
	}
	// A worker whose last update failed keeps serving its older deployment, on every member: the
	// Host keeps that deployment's bundle, so a node that joined since holds its script too (the
	// check above compares worker UIDs, not which deployment a node holds). Counted.
	var behind int
	require.NoError(w.t, w.db.QueryRow(ctx, `SELECT count(*) FROM workers w WHERE w.status = 'live' AND w.installation = 'selfhost'
		AND NOT EXISTS (SELECT 1 FROM deployments d WHERE d.resource_uid = w.uid AND d.generation = w.generation AND d.status = 'active')`).Scan(&behind))
	w.t.Logf("pool: %d node(s) killed, %d started again, %d retired as lost, %d added, %d retired started again, %d partition(s); %d live worker(s) without an active current deployment at the end",
		p.nodeKills, p.nodeRestarts, p.nodeRetires, p.nodeAdds, p.nodesBack, p.partitions, behind)
}
