// Package nodepool keeps the membership of selfhost pools (SPEC 6.2): which runtime nodes serve
// an installation, and the operator's changes of it. Membership lives in PostgreSQL, like every
// other authority. An installation with no rows is a pool of one, its node the catalog's
// runtimeUrl, named ImplicitNode; the first change of the pool writes that node's row.
//
// A node added joins: the node reconciler brings it up to date, then it serves. A node lost for
// good is retired: the operator attests it fenced, and its absences count as confirmed.
package nodepool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// ImplicitNode is the name of the catalog's node of a pool that has no membership rows.
const ImplicitNode = "node-1"

// DB is what the pool's reads and changes run on.
type DB interface {
	store.Beginner
	dbsqlc.DBTX
}

// Members is the backend's reader of pool membership (backend.PoolMembers), on DB. With a Cache
// (NewMembers), a replica reuses a read for CacheTTL, so that a backend call costs no database
// round trip of its own; a member that joined is then written only once settled (MemberSettle).
type Members struct {
	DB    dbsqlc.DBTX
	Cache *Cache
}

var _ backend.PoolMembers = Members{}

// CacheTTL is how long a replica reuses a read of a pool's membership. A stale read only ever
// lacks a member that is not yet settled (written nothing), or holds one retired, drained or
// removed since (asked, as before: the safe side).
const CacheTTL = 5 * time.Second

// MemberSettle is how long, by the database's clock, a joining member waits before anything is
// written to it: long enough that every replica's cached read from before it joined has expired.
const MemberSettle = 3 * CacheTTL

// Cache keeps each pool's membership read for CacheTTL, and when this process first read each
// joining member settled by the database's clock.
//
// A joining member is settled for this process only CacheTTL after that first read (by its own
// clock), so that the rule holds even when the database's clock jumps forward: every other
// replica's read from before the member joined has expired by then, so none confirms an absence
// without asking it; and the reconciler marks it serving only then, so that every replica's read
// in use writes every change to it.
type Cache struct {
	mu      sync.Mutex
	reads   map[string]cachedRead
	settled map[string]time.Time
}

type cachedRead struct {
	at      time.Time
	members []backend.PoolMember
}

// NewMembers is a membership reader on db that caches its reads.
func NewMembers(db dbsqlc.DBTX) Members {
	return Members{DB: db, Cache: &Cache{reads: map[string]cachedRead{}, settled: map[string]time.Time{}}}
}

// Members lists inst's members, the catalog's node alone when the pool has no rows.
func (m Members) Members(ctx context.Context, inst catalog.Installation) ([]backend.PoolMember, error) {
	return m.read(ctx, inst, true)
}

// Fresh reads inst's members afresh, whatever the cache holds.
func (m Members) Fresh(ctx context.Context, inst catalog.Installation) ([]backend.PoolMember, error) {
	return m.read(ctx, inst, false)
}

var _ backend.FreshPoolMembers = Members{}

func (m Members) read(ctx context.Context, inst catalog.Installation, cached bool) ([]backend.PoolMember, error) {
	if m.Cache != nil && cached {
		m.Cache.mu.Lock()
		r, ok := m.Cache.reads[inst.Name]
		m.Cache.mu.Unlock()
		// While a member is joining, every call reads afresh: the call after it is promoted sees it
		// serving (and writes to it, and counts it in Ready) at once, not one cache period later.
		if ok && time.Since(r.at) < CacheTTL && !slices.ContainsFunc(r.members, joining) {
			return slices.Clone(r.members), nil
		}
	}
	start := time.Now()
	rows, err := dbsqlc.New(m.DB).RuntimeNodesAsOf(ctx, inst.Name)
	if err != nil {
		return nil, fmt.Errorf("nodepool: members of %s: %w", inst.Name, store.Classify(err))
	}
	out := []backend.PoolMember{implicit(inst)}
	if len(rows) > 0 {
		out = make([]backend.PoolMember, len(rows))
		for i, r := range rows {
			out[i] = backend.PoolMember{Name: r.Name, URL: r.URL, State: string(r.State), Epoch: r.PoolEpoch, Since: r.ChangedAt,
				Settled: !r.AsOf.Before(r.AddedAt.Add(MemberSettle))}
			if r.PoolFenceSeconds >= 0 {
				f := time.Duration(r.PoolFenceSeconds) * time.Second
				out[i].Fence = &f
			}
			if m.Cache != nil && out[i].State == backend.MemberJoining && out[i].Settled {
				out[i].Settled = m.Cache.settledSince(inst.Name+"\x00"+r.Name+"\x00"+r.URL, start)
			}
		}
	}
	if m.Cache != nil && cached {
		m.Cache.mu.Lock()
		m.Cache.reads[inst.Name] = cachedRead{at: start, members: out}
		m.Cache.mu.Unlock()
	}
	return slices.Clone(out), nil
}

func joining(m backend.PoolMember) bool { return m.State == backend.MemberJoining }

// settledSince records at as when this process first read the member key settled, and reports
// whether CacheTTL has passed since then.
func (c *Cache) settledSince(key string, at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first, ok := c.settled[key]
	if !ok {
		c.settled[key], first = at, at
	}
	return time.Since(first) >= CacheTTL
}

func implicit(inst catalog.Installation) backend.PoolMember {
	return backend.PoolMember{Name: ImplicitNode, URL: inst.RuntimeURL, State: backend.MemberServing, Epoch: 1, Implicit: true, Settled: true}
}

// Node is one member as `takoserver nodes list` shows it.
type Node struct {
	Name        string     `json:"name"`
	URL         string     `json:"url"`
	State       string     `json:"state"`
	Epoch       int64      `json:"poolEpoch"`
	AddedAt     *time.Time `json:"addedAt,omitempty"`
	ChangedAt   *time.Time `json:"changedAt,omitempty"`
	FencedSince *time.Time `json:"fencedSince,omitempty"`
	// Implicit: the catalog's node of a pool with no rows yet.
	Implicit bool `json:"implicit,omitempty"`
}

// List is inst's members, with the catalog's node when the pool has no rows.
func List(ctx context.Context, db dbsqlc.DBTX, inst catalog.Installation) ([]Node, error) {
	rows, err := dbsqlc.New(db).RuntimeNodes(ctx, inst.Name)
	if err != nil {
		return nil, fmt.Errorf("nodepool: members of %s: %w", inst.Name, store.Classify(err))
	}
	if len(rows) == 0 {
		return []Node{{Name: ImplicitNode, URL: inst.RuntimeURL, State: backend.MemberServing, Epoch: 1, Implicit: true}}, nil
	}
	out := make([]Node, len(rows))
	for i, r := range rows {
		out[i] = node(r)
	}
	return out, nil
}

func node(r dbsqlc.RuntimeNode) Node {
	added := r.AddedAt
	changed := r.ChangedAt
	return Node{Name: r.Name, URL: r.URL, State: string(r.State), Epoch: r.PoolEpoch, AddedAt: &added, ChangedAt: &changed, FencedSince: r.FencedSince}
}

// Errors of the pool's changes, each with what the operator can do.
var (
	ErrNotSelfhost = errors.New("not a selfhost installation")
	ErrNoSuchNode  = errors.New("no such node")
	ErrNodeExists  = errors.New("a node of that name is already a member")
	ErrURLTaken    = errors.New("a member of the pool already answers at that URL")
	ErrNoPoolKey   = errors.New("a pool of several nodes needs the catalog's poolPublicKey: its secrets reach every node sealed to the pool's key (takoserver nodes init-pool-key)")
	ErrTooEarly    = errors.New("the node has not been fenced for the pool's fenceSeconds yet")
	ErrNotDrained  = errors.New("the node has not drained")
	ErrLastNode    = errors.New("the pool's last node is taken out only on purpose (--last-node)")
	ErrInFlight    = errors.New("the node is still being written")
	ErrBadName     = errors.New("a node's name is a name: lowercase letters, digits, '-' and '_', starting with a letter or digit, at most 63")
)

// Add makes the node at url a member of inst's pool, joining: it receives every change from
// now on and must confirm every absence, and the node reconciler brings it up to date, then marks
// it serving.
func Add(ctx context.Context, db DB, inst catalog.Installation, name, url, actor string) (Node, error) {
	if inst.Pack != catalog.PackSelfhost {
		return Node{}, fmt.Errorf("%w: %s", ErrNotSelfhost, inst.Name)
	}
	if !vocab.Name.MatchString(name) {
		return Node{}, fmt.Errorf("%w (got %q)", ErrBadName, name)
	}
	var out Node
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		rows, err := lockedMembers(ctx, q, inst)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if inst.PoolPublicKey == "" && r.State != dbsqlc.RuntimeNodeStateRemoved && r.State != dbsqlc.RuntimeNodeStateRetired {
				return fmt.Errorf("%w (%s may route)", ErrNoPoolKey, r.Name)
			}
			if r.Name == name {
				return fmt.Errorf("%w: %s (%s)", ErrNodeExists, name, r.State)
			}
			if r.URL == url && r.State != dbsqlc.RuntimeNodeStateRemoved && r.State != dbsqlc.RuntimeNodeStateRetired {
				return fmt.Errorf("%w: %s (%s)", ErrURLTaken, r.Name, r.State)
			}
		}
		row, err := q.RuntimeNodeInsert(ctx, dbsqlc.RuntimeNodeInsertParams{Installation: inst.Name, Name: name, URL: url, State: dbsqlc.RuntimeNodeStateJoining})
		if err != nil {
			return fmt.Errorf("nodepool: add %s: %w", name, store.Classify(err))
		}
		out = node(row)
		return event(ctx, q, inst.Name, name, "add", actor, map[string]any{"url": url})
	})
	return out, err
}

// Drain starts a member's way out of inst's pool: it leaves the Ready set at once, its health check
// fails once it is told (the caller tells it), and it stops serving the pool's fenceSeconds later.
// It still receives every change and must confirm every absence until it is removed or retired.
func Drain(ctx context.Context, db DB, inst catalog.Installation, name, actor string, lastNode bool) (Node, error) {
	if inst.Pack != catalog.PackSelfhost {
		return Node{}, fmt.Errorf("%w: %s", ErrNotSelfhost, inst.Name)
	}
	var out Node
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		rows, err := lockedMembers(ctx, q, inst)
		if err != nil {
			return err
		}
		serving, target := 0, false
		for _, r := range rows {
			if r.State == dbsqlc.RuntimeNodeStateServing {
				serving++
				target = target || r.Name == name
			}
		}
		if target && serving == 1 && !lastNode {
			return fmt.Errorf("%w: %s is the last serving node of pool %s: draining it stops every worker of the pool once the fence has passed",
				ErrLastNode, name, inst.Name)
		}
		row, err := q.RuntimeNodeDrain(ctx, dbsqlc.RuntimeNodeDrainParams{Installation: inst.Name, Name: name})
		if errors.Is(err, pgx.ErrNoRows) {
			for _, r := range rows {
				if r.Name == name {
					if r.State == dbsqlc.RuntimeNodeStateDraining {
						out = node(r) // draining already: tell it again
						return nil
					}
					return fmt.Errorf("%w: %s is %s", ErrNoSuchNode, name, r.State)
				}
			}
			return fmt.Errorf("%w: %s is not a member of %s", ErrNoSuchNode, name, inst.Name)
		}
		if err != nil {
			return fmt.Errorf("nodepool: drain %s: %w", name, store.Classify(err))
		}
		if err := q.RuntimeNodesBumpEpoch(ctx, dbsqlc.RuntimeNodesBumpEpochParams{Installation: inst.Name, Name: name}); err != nil {
			return fmt.Errorf("nodepool: move the pool's epoch on: %w", store.Classify(err))
		}
		out = node(row)
		fence, err := poolFence(ctx, q, inst)
		if err != nil {
			return err
		}
		return event(ctx, q, inst.Name, name, "drain", actor, map[string]any{"fenceSeconds": int64(fence.Seconds())})
	})
	return out, err
}

// Removable checks that name may be removed from inst's pool now: it is draining, and has been for
// the pool's fenceSeconds, by the database's clock. It answers the member.
func Removable(ctx context.Context, db dbsqlc.DBTX, inst catalog.Installation, name string) (Node, error) {
	q := dbsqlc.New(db)
	rows, err := q.RuntimeNodes(ctx, inst.Name)
	if err != nil {
		return Node{}, store.Classify(err)
	}
	for _, r := range rows {
		if r.Name != name {
			continue
		}
		if r.State != dbsqlc.RuntimeNodeStateDraining {
			return Node{}, fmt.Errorf("%w: %s is %s; a node is removed once drained (takoserver nodes drain)", ErrNotDrained, name, r.State)
		}
		now, err := q.DBNow(ctx)
		if err != nil {
			return Node{}, store.Classify(err)
		}
		fence, _, err := Fence(ctx, db, inst)
		if err != nil {
			return Node{}, err
		}
		if at := r.ChangedAt.Add(fence); now.Before(at) {
			return Node{}, fmt.Errorf("%w: %s drains until %s (the database's clock reads %s)", ErrNotDrained, name, at.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		return node(r), nil
	}
	return Node{}, fmt.Errorf("%w: %s is not a member of %s", ErrNoSuchNode, name, inst.Name)
}

// Remove takes a drained member that confirmed it holds nothing (the caller took everything off
// it and read it back) out of inst's pool: from then on it confirms nothing and needs not.
func Remove(ctx context.Context, db DB, inst catalog.Installation, name, actor string, takenOff int) (Node, error) {
	var out Node
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if _, err := lockedMembers(ctx, q, inst); err != nil {
			return err
		}
		fence, err := poolFence(ctx, q, inst)
		if err != nil {
			return err
		}
		row, err := q.RuntimeNodeRemove(ctx, dbsqlc.RuntimeNodeRemoveParams{Installation: inst.Name, Name: name, FenceSeconds: fence.Seconds()})
		if errors.Is(err, pgx.ErrNoRows) {
			if _, err := Removable(ctx, tx, inst, name); err != nil {
				return err
			}
			inFlight, err := q.RuntimeNodeEffectsInFlight(ctx, dbsqlc.RuntimeNodeEffectsInFlightParams{Name: name, Installation: inst.Name})
			if err != nil {
				return store.Classify(err)
			}
			if inFlight > 0 {
				return fmt.Errorf("%w: %d changes in flight are planned on %s; run remove again once they ended", ErrInFlight, inFlight, name)
			}
			return fmt.Errorf("%w: %s changed meanwhile", ErrNotDrained, name)
		}
		if err != nil {
			return fmt.Errorf("nodepool: remove %s: %w", name, store.Classify(err))
		}
		if err := q.RuntimeNodesBumpEpoch(ctx, dbsqlc.RuntimeNodesBumpEpochParams{Installation: inst.Name, Name: name}); err != nil {
			return fmt.Errorf("nodepool: move the pool's epoch on: %w", store.Classify(err))
		}
		out = node(row)
		return event(ctx, q, inst.Name, name, "remove", actor, map[string]any{"takenOff": takenOff})
	})
	return out, err
}

// Retire takes a node lost for good out of inst's pool: the operator attests, as actor, that it
// has been fenced (out of DNS and every load balancer) since fencedSince, which must be at least
// the pool's fenceSeconds ago. From then on its absences count as confirmed, so its workers and
// endpoints can be destroyed or moved; every member's epoch moves on. The attestation is kept in
// runtime_node_events.
func Retire(ctx context.Context, db DB, inst catalog.Installation, name string, fencedSince time.Time, actor string, lastNode bool) (Node, error) {
	if inst.Pack != catalog.PackSelfhost {
		return Node{}, fmt.Errorf("%w: %s", ErrNotSelfhost, inst.Name)
	}
	var out Node
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		rows, err := lockedMembers(ctx, q, inst)
		if err != nil {
			return err
		}
		routing, target := 0, false
		for _, r := range rows {
			if r.State != dbsqlc.RuntimeNodeStateRemoved && r.State != dbsqlc.RuntimeNodeStateRetired {
				routing++
				target = target || r.Name == name
			}
		}
		if target && routing == 1 && !lastNode {
			return fmt.Errorf("%w: %s is the last node of pool %s that may route: retiring it confirms the absence of everything the pool holds and stops every worker on it until a node is added",
				ErrLastNode, name, inst.Name)
		}
		fence, err := poolFence(ctx, q, inst)
		if err != nil {
			return err
		}
		row, err := q.RuntimeNodeRetire(ctx, dbsqlc.RuntimeNodeRetireParams{Installation: inst.Name, Name: name, FencedSince: fencedSince, FenceSeconds: fence.Seconds()})
		if errors.Is(err, pgx.ErrNoRows) {
			return retireRefusal(ctx, q, inst, name, fencedSince, fence)
		}
		if err != nil {
			return fmt.Errorf("nodepool: retire %s: %w", name, store.Classify(err))
		}
		if err := q.RuntimeNodesBumpEpoch(ctx, dbsqlc.RuntimeNodesBumpEpochParams{Installation: inst.Name, Name: name}); err != nil {
			return fmt.Errorf("nodepool: move the pool's epoch on: %w", store.Classify(err))
		}
		out = node(row)
		return event(ctx, q, inst.Name, name, "retire", actor, map[string]any{
			"lost": true, "fencedSince": fencedSince.UTC().Format(time.RFC3339), "fenceSeconds": int64(fence.Seconds()), "url": row.URL,
		})
	})
	return out, err
}

// retireRefusal says why a retire changed nothing.
func retireRefusal(ctx context.Context, q *dbsqlc.Queries, inst catalog.Installation, name string, fencedSince time.Time, fence time.Duration) error {
	rows, err := q.RuntimeNodes(ctx, inst.Name)
	if err != nil {
		return store.Classify(err)
	}
	for _, r := range rows {
		if r.Name != name {
			continue
		}
		if r.State == dbsqlc.RuntimeNodeStateRetired || r.State == dbsqlc.RuntimeNodeStateRemoved {
			return fmt.Errorf("%w: %s is %s already", ErrNoSuchNode, name, r.State)
		}
		now, err := q.DBNow(ctx)
		if err != nil {
			return store.Classify(err)
		}
		at := fencedSince.Add(fence)
		return fmt.Errorf("%w: fenced since %s, so it may be retired from %s (the database's clock reads %s; the pool's fenceSeconds is %d)",
			ErrTooEarly, fencedSince.UTC().Format(time.RFC3339), at.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339), int64(fence.Seconds()))
	}
	return fmt.Errorf("%w: %s is not a member of %s", ErrNoSuchNode, name, inst.Name)
}

// ServeAfter is how long, by the database's clock, a joining member waits before it serves (enters
// the Ready set): settled by the database's clock, so that a replica's read shows it settled
// unless that replica first read it so less than CacheTTL ago by its own clock. A replica reads
// the pool afresh on every call while a member is joining, so it sees the promotion at its next
// call; one that skipped the member just before (holding it unsettled) may have read a worker
// Ready without it, which the node reconciler writes at its next sweep.
const ServeAfter = MemberSettle + CacheTTL

// MarkServing moves a joining member the reconciler found up to date to serving; it answers false
// when the member was not joining, or joined less than ServeAfter ago.
func MarkServing(ctx context.Context, db DB, inst catalog.Installation, name string) (bool, error) {
	changed := false
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		n, err := q.RuntimeNodeServe(ctx, dbsqlc.RuntimeNodeServeParams{Installation: inst.Name, Name: name, SettleSeconds: ServeAfter.Seconds()})
		if err != nil || n == 0 {
			return store.Classify(err)
		}
		changed = true
		return event(ctx, q, inst.Name, name, "serve", "reconciler", map[string]any{})
	})
	return changed, err
}

// poolFence is the pool's fenceSeconds, which every replica and command uses: recorded from the
// catalog by the pool's first node command (the caller holds the pool's lock), and from then on the
// recorded one, whatever the catalog a command is given says (SetFence changes it).
func poolFence(ctx context.Context, q *dbsqlc.Queries, inst catalog.Installation) (time.Duration, error) {
	s, err := q.RuntimePoolFenceRecord(ctx, dbsqlc.RuntimePoolFenceRecordParams{Installation: inst.Name, CatalogFenceSeconds: int32(inst.Fence().Seconds())})
	if err != nil {
		return 0, fmt.Errorf("nodepool: the pool's fence: %w", store.Classify(err))
	}
	return time.Duration(s) * time.Second, nil
}

// Fence is inst's pool's fenceSeconds as every replica and command uses it, and whether it was
// recorded (false: none yet, so the catalog's).
func Fence(ctx context.Context, db dbsqlc.DBTX, inst catalog.Installation) (time.Duration, bool, error) {
	s, err := dbsqlc.New(db).RuntimePoolFence(ctx, inst.Name)
	if err != nil {
		return 0, false, fmt.Errorf("nodepool: the pool's fence: %w", store.Classify(err))
	}
	if s < 0 {
		return inst.Fence(), false, nil
	}
	return time.Duration(s) * time.Second, true, nil
}

// SetFence changes inst's pool's fenceSeconds for every replica and command; members are told
// at the next sweep. Who changed it last is kept beside it (runtime_pools).
func SetFence(ctx context.Context, db DB, inst catalog.Installation, fence time.Duration, actor string) (time.Duration, error) {
	if inst.Pack != catalog.PackSelfhost {
		return 0, fmt.Errorf("%w: %s", ErrNotSelfhost, inst.Name)
	}
	if fence < time.Second || fence%time.Second != 0 {
		return 0, fmt.Errorf("a fence is a whole number of seconds, at least 1 (got %s)", fence)
	}
	var was time.Duration
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if _, err := lockedMembers(ctx, q, inst); err != nil {
			return err
		}
		var err error
		if was, err = poolFence(ctx, q, inst); err != nil {
			return err
		}
		if err := q.RuntimePoolFenceSet(ctx, dbsqlc.RuntimePoolFenceSetParams{Installation: inst.Name, FenceSeconds: int32(fence.Seconds()), ChangedBy: actor}); err != nil {
			return fmt.Errorf("nodepool: set the pool's fence: %w", store.Classify(err))
		}
		return nil
	})
	return was, err
}

// LockKey names the advisory lock of installation's pool: every node command takes it, and a
// transaction that plans effects on the members holds it shared.
func LockKey(installation string) string { return "runtime_nodes:" + installation }

// lockedMembers takes the pool's lock and reads its rows, writing the catalog's node's first
// when there are none: from the first change on, the rows alone say who the members are (and the
// pool's fence is the recorded one).
func lockedMembers(ctx context.Context, q *dbsqlc.Queries, inst catalog.Installation) ([]dbsqlc.RuntimeNode, error) {
	if err := q.RuntimeNodesLock(ctx, LockKey(inst.Name)); err != nil {
		return nil, store.Classify(err)
	}
	// The pool's first node command records its fence from the catalog.
	if _, err := poolFence(ctx, q, inst); err != nil {
		return nil, err
	}
	rows, err := q.RuntimeNodes(ctx, inst.Name)
	if err != nil || len(rows) > 0 {
		return rows, store.Classify(err)
	}
	// A member since before any replica read the pool: settled.
	since := time.Unix(0, 0).UTC()
	first, err := q.RuntimeNodeInsert(ctx, dbsqlc.RuntimeNodeInsertParams{Installation: inst.Name, Name: ImplicitNode, URL: inst.RuntimeURL,
		State: dbsqlc.RuntimeNodeStateServing, AddedAt: &since})
	if err != nil {
		return nil, fmt.Errorf("nodepool: write the catalog's node: %w", store.Classify(err))
	}
	return []dbsqlc.RuntimeNode{first}, nil
}

func event(ctx context.Context, q *dbsqlc.Queries, installation, node, action, actor string, detail map[string]any) error {
	raw, err := json.Marshal(detail)
	if err != nil {
		return err
	}
	if err := q.RuntimeNodeEvent(ctx, dbsqlc.RuntimeNodeEventParams{Installation: installation, Node: node, Action: action, Actor: actor, Detail: raw}); err != nil {
		return fmt.Errorf("nodepool: record %s of %s: %w", action, node, store.Classify(err))
	}
	return nil
}

// MoveDigests rewrites, once, the offering digests that objects placed on selfhost offerings
// carry from the release before pools (they covered runtimeUrl) to the pool's digest (SPEC 6.2),
// so that an existing single-node catalog is a pool of one with no change and no worker drifts.
// Every Host start runs it: a row already rewritten is left alone. It answers how many rows moved.
func MoveDigests(ctx context.Context, db dbsqlc.DBTX, cat *catalog.Catalog) (int64, error) {
	q := dbsqlc.New(db)
	var moved int64
	for _, o := range cat.Offerings {
		if o.LegacyDigest == "" || o.LegacyDigest == o.Digest {
			continue
		}
		n, err := q.OfferingDigestMove(ctx, dbsqlc.OfferingDigestMoveParams{Digest: o.Digest, OfferingID: o.ID, Legacy: o.LegacyDigest})
		if err != nil {
			return moved, fmt.Errorf("nodepool: move the digest of offering %s: %w", o.ID, store.Classify(err))
		}
		moved += n
	}
	return moved, nil
}
