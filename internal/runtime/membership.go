package runtime

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// membership is the node's place in its pool as the Host last told it, and whether the Host has
// confirmed it since the node started.
type membership struct {
	mu        sync.Mutex
	m         *adminapi.Membership
	confirmed bool
	// drained: this draining member's fence passed and it stopped serving; it does not serve
	// again if it is later told a longer fence (its load balancers took it out already).
	drained bool
	// boot identifies this start of the node (adminapi.Status.Boot).
	boot string
}

// loadMembership reads the membership the node kept. A member of a pool of two or more comes back
// unconfirmed: it serves nothing until the Host has brought it up to date and said so, since it may
// have missed changes (a deletion its peers confirmed) while it was away. A node that was never
// told, or is a pool of one, serves at once from its own state.
func (n *Node) loadMembership() error {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	n.member.boot = hex.EncodeToString(b[:])
	raw, err := safedir.ReadFile(n.store.Dir(), state.MembershipFile, n.store.Owner())
	if errors.Is(err, fs.ErrNotExist) {
		n.member.confirmed = true
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the node's membership: %w", err)
	}
	var m adminapi.Membership
	if err := json.Unmarshal(raw, &m); err != nil {
		return fmt.Errorf("read the node's membership (%s): %w", state.MembershipFile, err)
	}
	n.member.m = &m
	n.member.confirmed = m.PoolSize < 2
	return nil
}

// routes says whether the edge routes workers, and why not.
func (n *Node) routes() (bool, string) {
	n.member.mu.Lock()
	defer n.member.mu.Unlock()
	return n.member.routesLocked(time.Now())
}

// routesLocked is routes with ms.mu held; it latches a drain whose fence has passed.
func (ms *membership) routesLocked(now time.Time) (bool, string) {
	m := ms.m
	switch {
	case m == nil:
		return true, ""
	case m.State == adminapi.MemberRetired || m.State == adminapi.MemberRemoved:
		return false, fmt.Sprintf("this node is %s from pool %s: it serves nothing until it is added again", m.State, m.Pool)
	case !ms.confirmed:
		return false, fmt.Sprintf("this node restarted as a member of pool %s (%d nodes): it serves nothing until the Host confirms it is up to date", m.Pool, m.PoolSize)
	case m.State == adminapi.MemberDraining && (ms.drained || m.DrainingSince != nil && !now.Before(m.DrainingSince.Add(time.Duration(m.FenceSeconds)*time.Second))):
		ms.drained = true
		return false, fmt.Sprintf("this node has drained from pool %s", m.Pool)
	}
	return true, ""
}

// inPool refuses h while the node's kept membership says it was retired or removed from its pool,
// from the moment it starts on that state: it is never again given a script, route, delivery or
// tick (a Host replica with an older view of the pool may still try), until it is wiped and added
// again under a new name.
func (n *Node) inPool(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) (any, error) {
		n.member.mu.Lock()
		m := n.member.m
		n.member.mu.Unlock()
		if m != nil && (m.State == adminapi.MemberRetired || m.State == adminapi.MemberRemoved) {
			return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeLeftPool, "Node left its pool",
				fmt.Sprintf("node %s was %s from pool %s: it takes nothing until its state directory is wiped and it is added again", m.Node, m.State, m.Pool))
		}
		return h(w, r)
	}
}

// memberHealth is the membership's part of the edge's GET /healthz: 200 only for a serving member
// whose edge routes.
func (n *Node) memberHealth() (bool, string) {
	n.member.mu.Lock()
	defer n.member.mu.Unlock()
	if ok, why := n.member.routesLocked(time.Now()); !ok {
		return false, why
	}
	if m := n.member.m; m != nil && m.State != adminapi.MemberServing {
		return false, fmt.Sprintf("this node is %s in pool %s", m.State, m.Pool)
	}
	return true, ""
}

// putMembership takes the node's place in its pool from the Host and keeps it; with Confirms
// naming this start of the node, the Host found it up to date, and a restarted member serves
// again (a confirmation of an earlier start, read before a restart, confirms nothing).
// A membership of an older epoch than the one held is refused: a Host replica with an old view
// cannot bring back a node a newer retirement took out.
func (n *Node) putMembership(_ http.ResponseWriter, r *http.Request) (any, error) {
	var req adminapi.Membership
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	switch req.State {
	case adminapi.MemberJoining, adminapi.MemberServing, adminapi.MemberDraining, adminapi.MemberRemoved, adminapi.MemberRetired:
	default:
		return nil, invalid("state %q is not a pool member's state", req.State)
	}
	if req.Pool == "" || req.Node == "" || req.Epoch < 1 || req.PoolSize < 0 || req.FenceSeconds < 0 {
		return nil, invalid("a membership names its pool, node, epoch (from 1), pool size and fence")
	}
	if req.State == adminapi.MemberDraining && req.DrainingSince == nil {
		return nil, invalid("a draining member says since when")
	}
	n.member.mu.Lock()
	defer n.member.mu.Unlock()
	if old := n.member.m; old != nil {
		if req.Epoch < old.Epoch {
			return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeStaleMembership, "Stale membership",
				fmt.Sprintf("this node holds epoch %d of pool %s; epoch %d is older", old.Epoch, old.Pool, req.Epoch))
		}
		if (old.State == adminapi.MemberRetired || old.State == adminapi.MemberRemoved) && old.Pool == req.Pool && old.Node == req.Node && req.State != old.State {
			return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeStaleMembership, "Node left its pool",
				fmt.Sprintf("node %s was %s from pool %s: wipe its state directory and add it under a new name", old.Node, old.State, old.Pool))
		}
	}
	raw, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if old := n.member.m; old != nil && (n.member.confirmed || req.Confirms != n.member.boot) {
		if was, err := json.Marshal(old); err == nil && string(was) == string(raw) {
			return n.member.statusLocked(), nil // told again each sweep: nothing to write
		}
	}
	if err := safedir.WriteFile(n.store.Dir(), state.MembershipFile, raw, n.store.Owner()); err != nil {
		return nil, fmt.Errorf("keep the node's membership: %w", err)
	}
	n.member.m = &req
	if req.State != adminapi.MemberDraining {
		n.member.drained = false
	}
	if req.Confirms != "" && req.Confirms == n.member.boot {
		n.member.confirmed = true
	}
	return n.member.statusLocked(), nil
}

// getMembership answers the node's place in its pool.
func (n *Node) getMembership(http.ResponseWriter, *http.Request) (any, error) {
	n.member.mu.Lock()
	defer n.member.mu.Unlock()
	return n.member.statusLocked(), nil
}

func (ms *membership) statusLocked() adminapi.MembershipStatus {
	ok, why := ms.routesLocked(time.Now())
	return adminapi.MembershipStatus{Membership: ms.m, Boot: ms.boot, Confirmed: ms.confirmed, Routes: ok, Reason: why}
}
