package selfhost

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// standIn is a runtime node's admin API that answers one route's status and secret readbacks,
// and records the readbacks it was sent.
type standIn struct {
	srv        *httptest.Server
	route      adminapi.RouteStatus
	holds      bool   // a delivery
	delivery   string // which one ("" answers none)
	mu         sync.Mutex
	concluded  []string
	unanswered bool
	// logs is what the node answers a log read from the start of its ring (then nothing new).
	logs []adminapi.LogEntry
	// deliveries counts the secret deliveries it was sent.
	deliveries int
}

func newStandIn(t *testing.T, route adminapi.RouteStatus, holds bool) *standIn {
	s := &standIn{route: route, holds: holds}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.unanswered {
			panic(http.ErrAbortHandler)
		}
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/secrets"):
			s.mu.Lock()
			s.deliveries++
			s.mu.Unlock()
			_ = json.NewEncoder(w).Encode(adminapi.ScriptStatus{})
		case strings.HasSuffix(r.URL.Path, "/logs"):
			page := adminapi.LogPage{Epoch: "ring", Next: uint64(len(s.logs))}
			if r.URL.Query().Get("epoch") == "" {
				page.Entries = s.logs
			}
			_ = json.NewEncoder(w).Encode(page)
		case strings.HasSuffix(r.URL.Path, "/readback"):
			var req adminapi.ReadbackRequest
			_ = json.NewDecoder(r.Body).Decode(&req)
			s.mu.Lock()
			if req.Concludes != "" && !s.holds {
				s.concluded = append(s.concluded, req.Concludes)
			}
			s.mu.Unlock()
			out := adminapi.Readback{Present: s.holds, DeliveryID: s.delivery}
			if s.holds {
				out.Digest = "00ff"
			}
			_ = json.NewEncoder(w).Encode(out)
		default:
			_ = json.NewEncoder(w).Encode(s.route)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// withDigest answers readbacks with digest (hex) in place of h's.
func withDigest(h http.Handler, digest string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/readback") {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		var out adminapi.Readback
		_ = json.Unmarshal(rec.Body.Bytes(), &out)
		out.Digest = digest
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(out)
	})
}

// members is a fixed pool membership.
type members []backend.PoolMember

func (m members) Members(context.Context, catalog.Installation) ([]backend.PoolMember, error) {
	return m, nil
}

func poolOf(t *testing.T, nodes ...*standIn) *pool {
	t.Helper()
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	var ms members
	for i, n := range nodes {
		ms = append(ms, backend.PoolMember{Name: string(rune('a' + i)), URL: n.srv.URL, State: backend.MemberServing, Epoch: 1, Settled: true})
	}
	inst := catalog.Installation{Name: "pool", Pack: catalog.PackSelfhost, RuntimeURL: nodes[0].srv.URL, RuntimeTokenFile: tokenFile}
	return NewMutator(inst, backend.PackEnv{Pools: ms}).(*pool)
}

// Members holding different deployments of one route (one lagged an update): the pool holds
// whichever deployment a delete names, so that the delete of the newer one is not done while a
// member still routes the older, and no one deployment reads admitted.
func TestAPoolWhoseMembersDisagreeHoldsEveryDeploymentAndAdmitsNone(t *testing.T) {
	t.Parallel()
	older, newer := uuid.New(), uuid.New()
	lagging := newStandIn(t, adminapi.RouteStatus{Present: true, Ready: true, DeploymentID: older.String()}, false)
	current := newStandIn(t, adminapi.RouteStatus{Present: false}, false)
	p := poolOf(t, lagging, current)
	obs, err := p.Observe(context.Background(), backend.NativeRoute, "api.workers.localhost")
	require.NoError(t, err)
	require.True(t, obs.Holds(newer), "a member still routes the origin")
	require.True(t, obs.Holds(older))

	current.route = adminapi.RouteStatus{Present: true, Ready: true, DeploymentID: newer.String()}
	obs, err = p.Observe(context.Background(), backend.NativeRoute, "api.workers.localhost")
	require.NoError(t, err)
	require.False(t, obs.Admitted, "no one deployment is the pool's")
	require.False(t, obs.Ready)

	// A member that does not answer: no absence is read.
	lagging.route, current.route = adminapi.RouteStatus{}, adminapi.RouteStatus{}
	lagging.unanswered = true
	_, err = p.Observe(context.Background(), backend.NativeRoute, "api.workers.localhost")
	require.Error(t, err)
}

// A readback in a pool settles on any member that holds the delivery and concludes it absent on
// none; it concludes it absent on every member only when every member answered that it does not
// hold it; a member that did not answer leaves it undecided.
func TestAPoolReadbackConcludesOnlyWhenEveryMemberAnsweredAbsent(t *testing.T) {
	t.Parallel()
	d := backend.Delivery{ScriptName: "s", WorkerUID: uuid.New(), MaterialSetID: uuid.New()}
	missed, took := newStandIn(t, adminapi.RouteStatus{}, true), newStandIn(t, adminapi.RouteStatus{}, true)
	missed.delivery, took.delivery = uuid.NewString(), d.MaterialSetID.String() // missed still holds the one before
	p := poolOf(t, missed, took)
	missed.srv.Config.Handler = withDigest(missed.srv.Config.Handler, "aaaa")
	digest, ok, err := p.ReadbackSecrets(context.Background(), d, []byte("challenge"))
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, []byte{0x00, 0xff}, digest, "the member holding this delivery answered, not the one holding the one before")
	require.Empty(t, missed.concluded, "the member that missed it may still be given it")
	missed.holds = false

	took.holds = false
	took.unanswered = true
	_, _, err = p.ReadbackSecrets(context.Background(), d, []byte("challenge"))
	require.Error(t, err, "a member that did not answer may hold it")
	require.Empty(t, missed.concluded)

	took.unanswered = false
	_, ok, err = p.ReadbackSecrets(context.Background(), d, []byte("challenge"))
	require.NoError(t, err)
	require.False(t, ok)
	require.Equal(t, []string{d.MaterialSetID.String()}, missed.concluded)
	require.Equal(t, []string{d.MaterialSetID.String()}, took.concluded)
}

// Nothing is written to a member that joined moments ago (another replica may still read the pool
// without it), nor to a suspect one; the deployment goes on with the others and names it lagging.
func TestAnUnsettledMemberIsWrittenNothing(t *testing.T) {
	t.Parallel()
	var writes sync.Map
	node := func(name string) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodPut {
				writes.Store(name, true)
			}
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(adminapi.RouteStatus{Present: true, Ready: true, DeploymentID: r.Header.Get("X-Test-Deployment")})
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	a, b := node("a"), node("b")
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	require.NoError(t, os.WriteFile(tokenFile, []byte("token\n"), 0o600))
	inst := catalog.Installation{Name: "pool", Pack: catalog.PackSelfhost, RuntimeURL: a.URL, RuntimeTokenFile: tokenFile}
	p := NewMutator(inst, backend.PackEnv{Pools: members{
		{Name: "a", URL: a.URL, State: backend.MemberServing, Epoch: 1, Settled: true},
		{Name: "b", URL: b.URL, State: backend.MemberJoining, Epoch: 1, Settled: false},
	}}).(*pool)
	err := p.Rewrite(context.Background(), backend.Desired{Kind: backend.NativeRoute, NativeName: "api.workers.localhost", DeploymentID: uuid.New(),
		EffectID: uuid.New(), ResourceUID: uuid.New(), ScriptName: "s"})
	require.NoError(t, err)
	_, wroteA := writes.Load("a")
	_, wroteB := writes.Load("b")
	require.True(t, wroteA)
	require.False(t, wroteB, "the unsettled member was written")
	views, err := p.Members(context.Background())
	require.NoError(t, err)
	require.Len(t, views, 1, "the reconciler leaves it too")
}

// Each node of a pool keeps the logs of the requests it served: a read merges every member's, in
// time order, leaves out one that does not answer, and fails only when none does.
func TestAPoolsLogsAreEveryMembersMergedInTimeOrder(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	entry := func(sec int, msg string) adminapi.LogEntry {
		return adminapi.LogEntry{Time: at.Add(time.Duration(sec) * time.Second), Level: "log", Message: msg}
	}
	a := newStandIn(t, adminapi.RouteStatus{}, false)
	a.logs = []adminapi.LogEntry{entry(1, "a1"), entry(4, "a4")}
	b := newStandIn(t, adminapi.RouteStatus{}, false)
	b.logs = []adminapi.LogEntry{entry(2, "b2"), entry(3, "b3"), entry(5, "b5")}
	c := newStandIn(t, adminapi.RouteStatus{}, false)
	c.unanswered = true
	p := poolOf(t, a, b, c)
	read := func() ([]string, error) {
		var got []string
		err := p.WorkerLogs(context.Background(), "s", uuid.New(), backend.LogQuery{}, func(e backend.LogEntry) error {
			got = append(got, e.Message)
			return nil
		}, func() error { return nil })
		return got, err
	}
	got, err := read()
	require.NoError(t, err, "a member that does not answer is left out")
	require.Equal(t, []string{"a1", "b2", "b3", "a4", "b5"}, got)

	a.unanswered, b.unanswered = true, true
	_, err = read()
	require.ErrorContains(t, err, "no node of the pool answered for the logs")

	// Following: every member's entries are handed on.
	a.unanswered, b.unanswered = false, false
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := map[string]bool{}
	done := make(chan error, 1)
	var mu sync.Mutex
	go func() {
		done <- p.WorkerLogs(ctx, "s", uuid.New(), backend.LogQuery{Follow: true}, func(e backend.LogEntry) error {
			mu.Lock()
			seen[e.Message] = true
			mu.Unlock()
			return nil
		}, func() error { return nil })
	}()
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == 5
	}, 10*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)

	// A quiet worker's stream opens at once and is flushed on a timer besides, so the caller's own
	// checks (is the worker still there?) run on it too.
	a.logs, b.logs = nil, nil
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	var flushes sync.WaitGroup
	flushes.Add(2)
	n := 0
	go func() {
		done <- p.WorkerLogs(ctx, "s", uuid.New(), backend.LogQuery{Follow: true}, func(backend.LogEntry) error { return nil }, func() error {
			mu.Lock()
			defer mu.Unlock()
			if n++; n <= 2 {
				flushes.Done()
			}
			return nil
		})
	}()
	waited := make(chan struct{})
	go func() { flushes.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("a quiet pool's log stream was never flushed twice")
	}
	cancel()
	require.NoError(t, <-done)
}

// staleMembers is a membership whose cached read still names a node the fresh read shows retired.
type staleMembers struct{ cached, fresh members }

func (m staleMembers) Members(ctx context.Context, inst catalog.Installation) ([]backend.PoolMember, error) {
	return m.cached.Members(ctx, inst)
}

func (m staleMembers) Fresh(ctx context.Context, inst catalog.Installation) ([]backend.PoolMember, error) {
	return m.fresh.Members(ctx, inst)
}

// A delivery reads the pool afresh: a node retired since a replica's cached read is never given
// the secret.
func TestADeliveryGoesOnlyToTheMembersOfAFreshRead(t *testing.T) {
	t.Parallel()
	a, b := newStandIn(t, adminapi.RouteStatus{}, false), newStandIn(t, adminapi.RouteStatus{}, false)
	p := poolOf(t, a, b)
	cached := members{p.members.(members)[0], p.members.(members)[1]}
	fresh := members{cached[0], cached[1]}
	fresh[0].State = backend.MemberRetired
	p.members = staleMembers{cached: cached, fresh: fresh}
	require.NoError(t, p.DeliverSealed(context.Background(), backend.Delivery{ScriptName: "s", WorkerUID: uuid.New(), MaterialSetID: uuid.New(), EffectID: uuid.New()}, []byte("blob")))
	require.Zero(t, a.deliveries, "the retired node was given the delivery")
	require.Equal(t, 1, b.deliveries)
}

// A member that left the pool (another replica retired or removed it since this one read the
// pool) refuses the write: the change fails as unreachable (which the API answers 503, and the
// provider retries on a fresh read), not as the backend refusing the change.
func TestAWriteToAMemberThatLeftThePoolFailsAsUnreachable(t *testing.T) {
	t.Parallel()
	left := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", adminapi.ProblemContentType)
		w.WriteHeader(http.StatusConflict)
		_ = json.NewEncoder(w).Encode(adminapi.NewProblem(http.StatusConflict, adminapi.CodeLeftPool, "Node left its pool", "node a was retired from pool pool"))
	}))
	t.Cleanup(left.Close)
	a := &standIn{srv: left}
	p := poolOf(t, a)
	_, err := p.Apply(context.Background(), backend.Desired{Kind: backend.NativeRoute, NativeName: "api.workers.localhost", ScriptName: "api",
		DeploymentID: uuid.New(), ResourceUID: uuid.New(), EffectID: uuid.New()})
	require.ErrorIs(t, err, backend.ErrUnreachable)
	require.ErrorContains(t, err, "left the pool")
}

// Every replica tells the members the pool's recorded fence, whatever its own catalog says; the
// catalog's only while none is recorded.
func TestAMemberIsToldThePoolsRecordedFence(t *testing.T) {
	t.Parallel()
	inst := catalog.Installation{Name: "pool", Pack: catalog.PackSelfhost, FenceSeconds: 600}
	recorded := 30 * time.Second
	n := &runtimeNode{inst: inst, member: backend.PoolMember{Name: "a", State: backend.MemberDraining, Epoch: 2, Since: time.Unix(100, 0), Fence: &recorded}}
	m := n.membership(3, "")
	require.Equal(t, 30, m.FenceSeconds)
	require.NotNil(t, m.DrainingSince)
	n.member.Fence = nil
	require.Equal(t, 600, n.membership(3, "").FenceSeconds)
}
