package nodepool_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func selfhost() catalog.Installation {
	return catalog.Installation{Name: "selfhost", Pack: catalog.PackSelfhost, RuntimeURL: "http://127.0.0.1:8788", PoolPublicKey: "x25519:test"}
}

func states(t *testing.T, db nodepool.DB, inst catalog.Installation) map[string]string {
	t.Helper()
	members, err := nodepool.Members{DB: db}.Members(context.Background(), inst)
	require.NoError(t, err)
	out := map[string]string{}
	for _, m := range members {
		out[m.Name] = m.State
	}
	return out
}

func TestAPoolWithoutRowsIsTheCatalogsNodeUntilItsFirstChange(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	members, err := nodepool.Members{DB: db}.Members(ctx, inst)
	require.NoError(t, err)
	require.Equal(t, []backend.PoolMember{{Name: nodepool.ImplicitNode, URL: inst.RuntimeURL, State: backend.MemberServing, Epoch: 1, Implicit: true, Settled: true}}, members)

	// A refused add writes nothing, not even the catalog's node.
	keyless := inst
	keyless.PoolPublicKey = ""
	_, err = nodepool.Add(ctx, db, keyless, "node-2", "http://127.0.0.1:9788", "op")
	require.ErrorIs(t, err, nodepool.ErrNoPoolKey, "a second node needs the pool key")
	_, err = nodepool.Add(ctx, db, inst, "node-2", inst.RuntimeURL, "op")
	require.ErrorIs(t, err, nodepool.ErrURLTaken)
	rows, err := db.Query(ctx, `SELECT name FROM runtime_nodes`)
	require.NoError(t, err)
	require.False(t, rows.Next())
	rows.Close()

	// The catalog's node is written first: the pool grows from it.
	_, err = nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"node-1": "serving", "node-2": "joining"}, states(t, db, inst))

	// Another installation's pool is its own.
	other := inst
	other.Name = "other"
	require.Equal(t, map[string]string{"node-1": "serving"}, states(t, db, other))
}

func TestRetireNeedsTheFenceAndMovesTheEpochOn(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	inst.FenceSeconds = 600

	_, err := nodepool.Retire(ctx, db, inst, "node-1", time.Now().Add(-5*time.Minute), "op", true)
	require.ErrorIs(t, err, nodepool.ErrTooEarly, "fenced 5 minutes of the pool's 10")
	require.ErrorContains(t, err, "fenceSeconds is 600")
	_, err = nodepool.Retire(ctx, db, inst, "node-9", time.Now().Add(-time.Hour), "op", true)
	require.ErrorIs(t, err, nodepool.ErrNoSuchNode)
	_, err = nodepool.Retire(ctx, db, inst, "node-1", time.Now().Add(time.Hour), "op", true)
	require.ErrorIs(t, err, nodepool.ErrTooEarly, "fenced in the future")

	fenced := time.Now().Add(-11 * time.Minute).Truncate(time.Second)
	_, err = nodepool.Retire(ctx, db, inst, "node-1", fenced, "oncall", false)
	require.ErrorIs(t, err, nodepool.ErrLastNode)
	n, err := nodepool.Retire(ctx, db, inst, "node-1", fenced, "oncall", true)
	require.NoError(t, err)
	require.Equal(t, backend.MemberRetired, n.State)
	require.EqualValues(t, 2, n.Epoch)
	require.True(t, fenced.Equal(*n.FencedSince))
	_, err = nodepool.Retire(ctx, db, inst, "node-1", fenced, "oncall", true)
	require.ErrorIs(t, err, nodepool.ErrNoSuchNode, "retired already")

	// The pool is empty now: nothing may route, and a node may join it, at the pool's epoch.
	added, err := nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	require.Equal(t, backend.MemberJoining, added.State)
	require.EqualValues(t, 2, added.Epoch)
	_, err = nodepool.Add(ctx, db, inst, "node-1", "http://127.0.0.1:9789", "op")
	require.ErrorIs(t, err, nodepool.ErrNodeExists, "a retired node's name is kept")
	_, err = nodepool.Add(ctx, db, inst, "Node_3", "http://127.0.0.1:9789", "op")
	require.ErrorIs(t, err, nodepool.ErrBadName)

	// A joining node serves only once every replica's read writes to it.
	ok, err := nodepool.MarkServing(ctx, db, inst, "node-2")
	require.NoError(t, err)
	require.False(t, ok, "joined moments ago")
	skew(t, db, nodepool.ServeAfter-2*time.Second)
	ok, err = nodepool.MarkServing(ctx, db, inst, "node-2")
	require.NoError(t, err)
	require.False(t, ok, "joined 2 s short of ServeAfter")
	skew(t, db, 3*time.Second)
	ok, err = nodepool.MarkServing(ctx, db, inst, "node-2")
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = nodepool.MarkServing(ctx, db, inst, "node-2")
	require.NoError(t, err)
	require.False(t, ok, "only a joining node moves")
	require.Equal(t, map[string]string{"node-1": "retired", "node-2": "serving"}, states(t, db, inst))

	// Retiring node-2 moves node-1's epoch on too.
	_, err = nodepool.Retire(ctx, db, inst, "node-2", fenced, "oncall", true)
	require.NoError(t, err)
	list, err := nodepool.List(ctx, db, inst)
	require.NoError(t, err)
	for _, n := range list {
		require.EqualValues(t, 3, n.Epoch, n.Name)
	}

	var actions []string
	rows, err := db.Query(ctx, `SELECT node || ':' || action || ':' || actor FROM runtime_node_events ORDER BY id`)
	require.NoError(t, err)
	for rows.Next() {
		var a string
		require.NoError(t, rows.Scan(&a))
		actions = append(actions, a)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, []string{"node-1:retire:oncall", "node-2:add:op", "node-2:serve:reconciler", "node-2:retire:oncall"}, actions)
}

// Operators adding the same node to a pool at once, under different names: the pool's lock lets
// one in, and the others are told why. The table is locked against writes until every add has started, so that without
// the pool's lock each would read the pool before any wrote to it.
func TestConcurrentAddsLetOneNodeIn(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	_, err := nodepool.Retire(ctx, db, inst, "node-1", time.Now().Add(-time.Hour), "op", true)
	require.NoError(t, err)
	hold, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, `LOCK TABLE runtime_nodes IN EXCLUSIVE MODE`)
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			_, errs[i] = nodepool.Add(ctx, db, inst, "node-"+string(rune('a'+i)), "http://127.0.0.1:5000", "op")
		})
	}
	time.Sleep(time.Second)
	require.NoError(t, hold.Rollback(ctx))
	wg.Wait()
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
			continue
		}
		require.ErrorIs(t, err, nodepool.ErrURLTaken)
	}
	require.Equal(t, 1, ok)
}

// A node leaves the pool by drain, then remove once it has drained for the pool's fence (by the
// database's clock); remove is refused before, and for a node that is not draining.
func TestRemoveFollowsADrainOfTheFencesLength(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	inst.FenceSeconds = 600
	_, err := nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	_, err = nodepool.Removable(ctx, db, inst, "node-2")
	require.ErrorIs(t, err, nodepool.ErrNotDrained, "joining")
	n, err := nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.NoError(t, err)
	require.Equal(t, backend.MemberDraining, n.State)
	_, err = nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.NoError(t, err, "draining again tells it again")
	_, err = nodepool.Remove(ctx, db, inst, "node-2", "op", 0)
	require.ErrorIs(t, err, nodepool.ErrNotDrained, "the fence has not passed")
	require.ErrorContains(t, err, "drains until")

	_, err = db.Exec(ctx, `INSERT INTO clock_skew (skew) VALUES ('11 minutes'::interval)
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
	require.NoError(t, err)
	_, err = nodepool.Removable(ctx, db, inst, "node-2")
	require.NoError(t, err)
	n, err = nodepool.Remove(ctx, db, inst, "node-2", "op", 3)
	require.NoError(t, err)
	require.Equal(t, backend.MemberRemoved, n.State)
	require.Equal(t, map[string]string{"node-1": "serving", "node-2": "removed"}, states(t, db, inst))
	_, err = nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.ErrorIs(t, err, nodepool.ErrNoSuchNode)
}

// runningOperation records an operation of a new organization that is still running, and answers
// it and the organization.
func runningOperation(t *testing.T, db *pgxpool.Pool) (uuid.UUID, string) {
	t.Helper()
	ctx := context.Background()
	org, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	op := uuid.Must(uuid.NewV7())
	require.NoError(t, dbsqlc.New(db).OperationRecord(ctx, dbsqlc.OperationRecordParams{ID: op, OrganizationID: org.ID, Kind: "worker", ExternalKey: "prod/api", Method: "PUT", Status: dbsqlc.OperationStatusCommitted}))
	_, err = db.Exec(ctx, `UPDATE operations SET status = 'running', finished_at = NULL WHERE id = $1`, op)
	require.NoError(t, err)
	return op, org.ID
}

// planApply records, through q, a worker deployment of org on inst and its apply effect under
// operation op, dispatched, and answers the effect.
func planApply(t *testing.T, q *dbsqlc.Queries, inst catalog.Installation, op uuid.UUID, org string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	deployment, effect := uuid.New(), uuid.New()
	_, err := q.DeploymentInsert(ctx, dbsqlc.DeploymentInsertParams{ID: deployment, OrganizationID: org, ResourceKind: dbsqlc.ResourceKindWorker, ResourceUID: uuid.New(),
		Generation: 1, NativeName: "api", OfferingID: "selfhost-worker", OfferingDigest: "d", Pack: "selfhost", Installation: inst.Name})
	require.NoError(t, err)
	require.NoError(t, q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: effect, OperationID: op, DeploymentID: deployment, Action: dbsqlc.EffectActionApply, Status: dbsqlc.EffectStatusDispatched}))
	return effect
}

// A drained node is not removed while a running operation has an effect planned on it (a deploy
// in flight that read the pool before the drain may still write to it): the remove reads those
// effects in its own statement, and goes through once the operation ended.
func TestRemoveWaitsForTheChangesInFlightOnTheNode(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	inst.FenceSeconds = 1
	q := dbsqlc.New(db)
	_, err := nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	op, org := runningOperation(t, db)
	effect := planApply(t, q, inst, op, org)
	require.NoError(t, q.EffectsPlanMembers(ctx, effect))
	var planned string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(node, ',' ORDER BY node) FROM backend_effects WHERE parent_id = $1`, effect).Scan(&planned))
	require.Equal(t, "node-1,node-2", planned, "one effect per member that may route")

	_, err = nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO clock_skew (skew) VALUES ('2 minutes'::interval)
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
	require.NoError(t, err)
	_, err = nodepool.Remove(ctx, db, inst, "node-2", "op", 0)
	require.ErrorIs(t, err, nodepool.ErrInFlight)
	require.Equal(t, map[string]string{"node-1": "serving", "node-2": "draining"}, states(t, db, inst))

	_, err = db.Exec(ctx, `UPDATE operations SET status = 'committed', finished_at = now() WHERE id = $1`, op)
	require.NoError(t, err)
	n, err := nodepool.Remove(ctx, db, inst, "node-2", "op", 0)
	require.NoError(t, err)
	require.Equal(t, backend.MemberRemoved, n.State)
}

// A remove waits for a transaction that is planning effects on the pool (it holds the pool's
// lock shared) and then sees the effect that transaction committed: no member is removed while a
// plan naming it is being committed.
func TestRemoveWaitsForAPlanBeingCommitted(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	inst.FenceSeconds = 1
	_, err := nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	_, err = nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.NoError(t, err)
	_, err = db.Exec(ctx, `INSERT INTO clock_skew (skew) VALUES ('2 minutes'::interval)
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`)
	require.NoError(t, err)
	op, org := runningOperation(t, db)

	// The plan: its own transaction, holding the pool's lock shared, not committed yet.
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	tq := dbsqlc.New(tx)
	effect := planApply(t, tq, inst, op, org)
	require.NoError(t, tq.RuntimeNodesShareLock(ctx, nodepool.LockKey(inst.Name)))
	require.NoError(t, tq.EffectsPlanMembers(ctx, effect))

	removed := make(chan error, 1)
	go func() {
		_, err := nodepool.Remove(ctx, db, inst, "node-2", "op", 0)
		removed <- err
	}()
	select {
	case err := <-removed:
		t.Fatalf("the remove did not wait for the plan: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	require.NoError(t, tx.Commit(ctx))
	require.ErrorIs(t, <-removed, nodepool.ErrInFlight, "the plan's effect on node-2, committed, is seen")
	require.Equal(t, "draining", states(t, db, inst)["node-2"])
}

// The pool's fence is one value for every Host replica and node command (SPEC 6.2): recorded
// from the catalog by the pool's first node command. A command given a catalog with a shorter
// fenceSeconds still uses the recorded one (it cannot retire a node early), the members' reads
// carry it (every replica tells nodes the same), and nodes set-fence changes it.
func TestThePoolsFenceIsOneValueWhateverACommandsCatalogSays(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	inst.FenceSeconds = 600
	fence, recorded, err := nodepool.Fence(ctx, db, inst)
	require.NoError(t, err)
	require.False(t, recorded, "no node command yet: the catalog's")
	require.Equal(t, 600*time.Second, fence)
	_, err = nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)

	short := inst
	short.FenceSeconds = 1
	fence, recorded, err = nodepool.Fence(ctx, db, short)
	require.NoError(t, err)
	require.True(t, recorded)
	require.Equal(t, 600*time.Second, fence)
	_, err = nodepool.Retire(ctx, db, short, "node-2", time.Now().Add(-time.Minute), "op", false)
	require.ErrorIs(t, err, nodepool.ErrTooEarly, "a catalog with a shorter fence retires nothing early")
	require.ErrorContains(t, err, "fenceSeconds is 600")
	members, err := nodepool.Members{DB: db}.Members(ctx, short)
	require.NoError(t, err)
	for _, m := range members {
		require.NotNil(t, m.Fence, m.Name)
		require.Equal(t, 600*time.Second, *m.Fence, "every replica tells %s the pool's fence", m.Name)
	}

	was, err := nodepool.SetFence(ctx, db, short, 30*time.Second, "oncall@example.com")
	require.NoError(t, err)
	require.Equal(t, 600*time.Second, was)
	n, err := nodepool.Retire(ctx, db, inst, "node-2", time.Now().Add(-time.Minute), "op", false)
	require.NoError(t, err, "the catalog's 600 no longer holds either: the pool's is 30")
	require.Equal(t, backend.MemberRetired, n.State)
}

// Draining the pool's last serving node stops every worker of the pool: it is refused and
// changes nothing unless asked for on purpose. Each drain moves the pool's epoch on, on every
// member, so that a node told its place by an older epoch is refused.
func TestDrainRefusesTheLastServingNodeAndMovesTheEpochOn(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	_, err := nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	_, err = nodepool.Drain(ctx, db, inst, "node-1", "op", false)
	require.ErrorIs(t, err, nodepool.ErrLastNode, "node-2 is joining: node-1 is the last serving node")
	require.Equal(t, map[string]string{"node-1": "serving", "node-2": "joining"}, states(t, db, inst))
	epochs := func() map[string]int64 {
		list, err := nodepool.List(ctx, db, inst)
		require.NoError(t, err)
		out := map[string]int64{}
		for _, n := range list {
			out[n.Name] = n.Epoch
		}
		return out
	}
	before := epochs()
	require.Equal(t, before["node-1"], before["node-2"])

	_, err = nodepool.Drain(ctx, db, inst, "node-2", "op", false)
	require.NoError(t, err, "a joining node is not serving: draining it leaves node-1 serving")
	after := epochs()
	require.Equal(t, map[string]int64{"node-1": before["node-1"] + 1, "node-2": before["node-2"] + 1}, after)

	n, err := nodepool.Drain(ctx, db, inst, "node-1", "oncall", true)
	require.NoError(t, err, "on purpose")
	require.Equal(t, backend.MemberDraining, n.State)
	require.Equal(t, after["node-1"]+1, epochs()["node-1"])
}

// A replica's cached read of the pool may lack a member that joined since; that member reads
// unsettled, by the database's clock, until every such read has expired, and nothing is written
// to it meanwhile (the pack's rule), so no replica confirms an absence without asking a member
// that holds the object.
func TestAJoiningMemberSettlesOnlyAfterEveryCachedReadExpired(t *testing.T) {
	t.Parallel()
	db, ctx, inst := testdb.Pool(t), context.Background(), selfhost()
	cached := nodepool.NewMembers(db)
	before, err := cached.Members(ctx, inst)
	require.NoError(t, err)
	require.Len(t, before, 1)
	_, err = nodepool.Add(ctx, db, inst, "node-2", "http://127.0.0.1:9788", "op")
	require.NoError(t, err)
	stale, err := cached.Members(ctx, inst)
	require.NoError(t, err)
	require.Len(t, stale, 1, "within CacheTTL the replica reads the pool it read before")

	fresh, err := nodepool.Members{DB: db}.Members(ctx, inst)
	require.NoError(t, err)
	require.Len(t, fresh, 2)
	require.True(t, fresh[0].Settled)
	require.False(t, fresh[1].Settled, "joined moments ago")
	skew(t, db, nodepool.MemberSettle+time.Second)
	fresh, err = nodepool.Members{DB: db}.Members(ctx, inst)
	require.NoError(t, err)
	require.True(t, fresh[1].Settled, "settled once every cached read has expired")
	require.Greater(t, nodepool.MemberSettle, nodepool.CacheTTL)

	// The database's clock jumped past MemberSettle: a Host's reader that first reads the member
	// settled holds it unsettled for CacheTTL more by its own clock (another replica's read from
	// before the member joined may still be in use that long).
	fresh, err = cached.Fresh(ctx, inst)
	require.NoError(t, err)
	require.False(t, fresh[1].Settled, "first read settled by the database's clock moments ago")
	time.Sleep(nodepool.CacheTTL)
	fresh, err = cached.Fresh(ctx, inst)
	require.NoError(t, err)
	require.True(t, fresh[1].Settled)
	require.True(t, fresh[0].Settled, "a serving member is settled whenever this process first reads it")
}

// skew moves the database's clock d on.
func skew(t *testing.T, db *pgxpool.Pool, d time.Duration) {
	t.Helper()
	_, err := db.Exec(context.Background(), `INSERT INTO clock_skew (skew) VALUES ($1::interval)
		ON CONFLICT (singleton) DO UPDATE SET skew = clock_skew.skew + excluded.skew`, d.String())
	require.NoError(t, err)
}
