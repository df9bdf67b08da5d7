package selfhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// pool is the selfhost pack's mutator: every worker of the pool runs on every member that may
// route (SPEC 6.2), so each change goes to each of them, one after the other (an update rolls node
// by node), and each read asks them all.
//
//   - Custody: an absence is confirmed only when every member that may route (joining, serving,
//     draining) confirmed it. A member retired as lost or removed confirms nothing and needs not.
//   - Ready: the deployment is active on every serving member that is not suspect. A serving member
//     silent for the pool's suspectAfter is suspect: it leaves the Ready set, never custody, and
//     the node reconciler brings it up to date when it answers again. A joining member is not in
//     the Ready set either.
//   - Secrets: a pool of several members takes deliveries sealed to its pool key only; every
//     member is given the blob, and settle needs one member's readback. One that missed it gets it
//     from the reconciler, as a node that lost its state does.
//
// Which nodes are members, the membership rows say (nodepool): each call reads them, so a change
// is seen at the next call on every Host replica.
type pool struct {
	inst    catalog.Installation
	log     *slog.Logger
	members backend.PoolMembers
	shared  *shared
}

// NewMutator is the selfhost pack's mutator of inst (a backend.Pack).
func NewMutator(inst catalog.Installation, env backend.PackEnv) backend.Mutator {
	return &pool{inst: inst, log: env.Log, members: env.Pools,
		shared: &shared{clients: map[string]*Client{}, poolOK: map[string]time.Time{}, silentSince: map[string]time.Time{}}}
}

// nodeStatusWait bounds a read of one member: a late node is reported, never waited on.
const nodeStatusWait = 2 * time.Second

// targets are the members that may route, as runtimeNodes.
func (p *pool) targets(ctx context.Context) ([]*runtimeNode, error) {
	return p.targetsOf(ctx, false)
}

// read reads the pool's members; fresh bypasses a cached read (the reconciler's, off the request
// path: it must never write to a member another replica's cache still shows serving).
func (p *pool) read(ctx context.Context, fresh bool) ([]backend.PoolMember, error) {
	if p.members == nil {
		return []backend.PoolMember{{Name: "node-1", URL: p.inst.RuntimeURL, State: backend.MemberServing, Settled: true}}, nil
	}
	if f, ok := p.members.(backend.FreshPoolMembers); ok && fresh {
		return f.Fresh(ctx, p.inst)
	}
	return p.members.Members(ctx, p.inst)
}

func (p *pool) targetsOf(ctx context.Context, fresh bool) ([]*runtimeNode, error) {
	members, err := p.read(ctx, fresh)
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: read its pool: %v", backend.ErrUnreachable, p.inst.Name, err)
	}
	var out []*runtimeNode
	for _, m := range members {
		if m.MayRoute() {
			out = append(out, &runtimeNode{inst: p.inst, log: p.log, shared: p.shared, member: m})
		}
	}
	p.shared.mu.Lock()
	p.shared.routing = len(out)
	p.shared.mu.Unlock()
	if len(out) == 0 {
		return nil, backend.ErrPoolEmpty
	}
	return out, nil
}

// noNode is the error of a change when the pool has no member.
func (p *pool) noNode() error {
	return fmt.Errorf("%w: installation %s: %w: every node was retired; add one (takoserver nodes add)", backend.ErrUnreachable, p.inst.Name, backend.ErrPoolEmpty)
}

// heard records whether n answered: a member that does not answer is silent from its first miss.
func (p *pool) heard(n *runtimeNode, err error) {
	p.shared.mu.Lock()
	defer p.shared.mu.Unlock()
	switch {
	case err == nil || !errors.Is(err, backend.ErrUnreachable):
		delete(p.shared.silentSince, n.member.URL)
	case p.shared.silentSince[n.member.URL].IsZero():
		p.shared.silentSince[n.member.URL] = time.Now()
	}
}

// suspect reports whether n has been silent for the pool's suspectAfter.
func (p *pool) suspect(n *runtimeNode) bool {
	return p.shared.suspect(n.member.URL, p.inst.Suspect())
}

// writable reports whether changes are written to n now: not to a suspect member (the
// reconciler writes it when it answers again), nor to one that joined so recently that another
// replica may still read the pool without it (it would not be asked before an absence is
// confirmed).
func (p *pool) writable(n *runtimeNode) bool {
	return n.member.Settled && !p.suspect(n)
}

// mustTake reports whether a change n missed fails the call: a serving member that is not
// suspect must take every change; a joining or suspect one is brought up to date by the reconciler.
func (p *pool) mustTake(n *runtimeNode) bool {
	return n.member.State == backend.MemberServing && !p.suspect(n)
}

func (p *pool) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	nodes, err := p.targets(ctx)
	if err != nil {
		return backend.Observation{}, p.unlessEmpty(err)
	}
	var first *backend.Observation
	var lagging []string
	var reads []read
	for _, n := range nodes {
		if !p.writable(n) {
			// Silent for suspectAfter (a blackholed machine must not spend the deployment's
			// time), or not settled yet: the reconciler writes it later.
			lagging = append(lagging, n.member.Name)
			reads = append(reads, read{node: n, err: errNotWritten})
			continue
		}
		obs, err := n.Apply(ctx, d)
		p.heard(n, err)
		reads = append(reads, read{node: n, obs: obs, err: err})
		must := p.mustTake(n)
		switch {
		case err != nil && must:
			return backend.Observation{}, fmt.Errorf("node %s: %w", n.member.Name, err)
		case !must && (err != nil || obs.Failed || !obs.Admitted || obs.DeploymentID != d.DeploymentID):
			// A member outside the Ready set never decides the deployment: it lags.
			lagging = append(lagging, n.member.Name)
			continue
		case obs.Failed || (obs.Present && obs.DeploymentID != d.DeploymentID):
			// Refused (the candidate failed), or rewritten meanwhile: the caller decides.
			obs.Members = memberReads(reads)
			return obs, nil
		case !obs.Admitted:
			obs.Members = memberReads(reads)
			return obs, nil
		}
		if first == nil || must {
			o := obs
			first = &o
		}
	}
	if first == nil {
		return backend.Observation{}, fmt.Errorf("%w: installation %s: no node of the pool took the deployment (%s lag)", backend.ErrUnreachable, p.inst.Name, strings.Join(lagging, ", "))
	}
	obs := *first
	if len(lagging) > 0 && obs.Message == "" {
		obs.Message = "lagging: " + strings.Join(lagging, ", ")
	}
	obs.Members = memberReads(reads)
	return obs, nil
}

// errNotWritten is a member's part in a change the pool did not write to it: the node reconciler
// brings it up to date.
var errNotWritten = errors.New("not written now (silent, or joined moments ago): the node reconciler brings it up to date")

// unlessEmpty is err, or the change's error of a pool with no member.
func (p *pool) unlessEmpty(err error) error {
	if errors.Is(err, backend.ErrPoolEmpty) {
		return p.noNode()
	}
	return err
}

func (p *pool) Rewrite(ctx context.Context, d backend.Desired) error {
	nodes, err := p.targets(ctx)
	if err != nil {
		return p.unlessEmpty(err)
	}
	var errs []error
	for _, n := range nodes {
		if !p.writable(n) {
			continue // written by the reconciler later
		}
		err := n.Rewrite(ctx, d)
		p.heard(n, err)
		if err != nil && p.mustTake(n) {
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
		}
	}
	return errors.Join(errs...)
}

// Delete takes d down on every member that may route: a member that did not confirm fails it,
// suspect or not (custody waits for every member, or for its retirement).
func (p *pool) Delete(ctx context.Context, d backend.Desired) error {
	nodes, err := p.targets(ctx)
	if errors.Is(err, backend.ErrPoolEmpty) {
		// Every node that held it was retired as lost (fenced, attested by the operator) or
		// removed (it confirmed it holds nothing): the absence is confirmed (SPEC 6.2).
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range nodes {
		err := n.Delete(ctx, d)
		p.heard(n, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
		}
	}
	return errors.Join(errs...)
}

// read is one member's answer to a read.
type read struct {
	node *runtimeNode
	obs  backend.Observation
	err  error
}

// readAll asks every member at once, each within nodeStatusWait.
func (p *pool) readAll(ctx context.Context, nodes []*runtimeNode, kind, nativeName string) []read {
	out := make([]read, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, nodeStatusWait)
			defer cancel()
			obs, err := n.Observe(rctx, kind, nativeName)
			if err != nil && rctx.Err() != nil && ctx.Err() == nil {
				err = fmt.Errorf("%w: runtime node %s did not answer within %s", backend.ErrUnreachable, n.member.URL, nodeStatusWait)
			}
			p.heard(n, err)
			out[i] = read{node: n, obs: obs, err: err}
		})
	}
	wg.Wait()
	return out
}

// Observe reads the object on every member and answers what the pool holds: absent only when
// every member that may route answered absent (an error when one that did not answer may hold it); Ready only when every serving member outside the
// suspect ones holds it Ready, at the same deployment. The message names the nodes that lag.
func (p *pool) Observe(ctx context.Context, kind, nativeName string) (backend.Observation, error) {
	nodes, err := p.targets(ctx)
	if errors.Is(err, backend.ErrPoolEmpty) {
		return backend.Observation{}, nil // no node of the pool may hold it
	}
	if err != nil {
		return backend.Observation{}, err
	}
	if len(nodes) == 1 {
		obs, err := nodes[0].Observe(ctx, kind, nativeName)
		p.heard(nodes[0], err)
		if err == nil && nodes[0].member.State != backend.MemberServing && obs.Ready {
			obs.Ready, obs.Reason = false, adminapi.ReasonPending
			obs.Message = strings.TrimSpace(obs.Message + " (not Ready on a serving node: " + nodes[0].member.Name + " is " + nodes[0].member.State + ")")
		}
		if err == nil {
			obs.Members = memberReads([]read{{node: nodes[0], obs: obs}})
		}
		return obs, err
	}
	reads := p.readAll(ctx, nodes, kind, nativeName)
	// The answer starts from a serving member that holds the object, else any member that holds
	// it, else any that answered.
	rank := func(r read) int {
		return 2*boolOrder(r.obs.Present) + boolOrder(r.node.member.State == backend.MemberServing)
	}
	var out *backend.Observation
	best := -1
	var silent []error
	var lagging []string
	for _, r := range reads {
		if r.err != nil {
			silent = append(silent, fmt.Errorf("node %s: %w", r.node.member.Name, r.err))
			continue
		}
		if rank(r) > best {
			o := r.obs
			out, best = &o, rank(r)
		}
	}
	if out == nil {
		return backend.Observation{}, errors.Join(silent...)
	}
	if len(silent) > 0 && !out.Present {
		// What a silent member holds is unknown: an absence it did not confirm is no absence.
		return backend.Observation{}, fmt.Errorf("absence not confirmed by every node of the pool: %w", errors.Join(silent...))
	}
	obs := *out
	obs.Version = "" // no one node's version watches the pool
	for _, r := range reads {
		if r.err == nil && (r.obs.Present != obs.Present || r.obs.DeploymentID != obs.DeploymentID) {
			// Members hold different deployments of it, or some none (one lags): a delete of any
			// deployment is not done while a member holds any, and no one deployment is admitted
			// by the pool (Ready, which only the Ready set decides, is reckoned below).
			obs.AnyDeployment, obs.Admitted = true, false
		}
	}
	inReadySet := 0
	for _, r := range reads {
		serving := r.node.member.State == backend.MemberServing && !p.suspect(r.node)
		if r.err == nil && serving {
			obs.Failed = obs.Failed || r.obs.Failed
			if r.obs.Incident && !obs.Incident {
				obs.Incident, obs.IncidentMessage = r.obs.Incident, r.obs.IncidentMessage
			}
			if r.obs.Quarantined && !obs.Quarantined {
				obs.Quarantined, obs.QuarantineMessage = true, r.obs.QuarantineMessage
			}
		}
		if !serving {
			if r.node.member.State == backend.MemberServing {
				lagging = append(lagging, r.node.member.Name+" (suspect: silent, outside the Ready set)")
			}
			continue
		}
		inReadySet++
		if r.err != nil || !r.obs.Ready || r.obs.DeploymentID != obs.DeploymentID {
			lagging = append(lagging, r.node.member.Name)
			obs.Ready = false
			if r.err != nil || !r.obs.Admitted || r.obs.DeploymentID != obs.DeploymentID {
				obs.Admitted = false
			}
		}
	}
	if inReadySet == 0 {
		obs.Ready, obs.Admitted = false, false
		lagging = append(lagging, "no serving node")
	}
	if len(lagging) > 0 && !obs.Ready {
		if obs.Reason == "" || obs.Reason == adminapi.ReasonReady {
			obs.Reason = adminapi.ReasonPending
		}
		obs.Message = strings.TrimSpace(obs.Message + " (not Ready on: " + strings.Join(lagging, ", ") + ")")
	}
	obs.Members = memberReads(reads)
	return obs, nil
}

// memberReads is what each member answered, for the ledger (the catalog's node of a pool without
// membership rows has no effect of its own).
func memberReads(reads []read) []backend.MemberRead {
	var out []backend.MemberRead
	for _, r := range reads {
		if r.node.member.Implicit {
			continue
		}
		m := backend.MemberRead{Name: r.node.member.Name, State: r.node.member.State}
		if r.err != nil {
			m.Err = r.err.Error()
		} else {
			m.Present, m.DeploymentID, m.Admitted = r.obs.Present, r.obs.DeploymentID, r.obs.Admitted
		}
		out = append(out, m)
	}
	return out
}

// ObserveChange holds a read on a pool of one node until its status changes; a pool of several
// is read at once.
func (p *pool) ObserveChange(ctx context.Context, kind, nativeName string, since backend.Observation, within time.Duration) (backend.Observation, error) {
	nodes, err := p.targets(ctx)
	if err != nil || len(nodes) > 1 {
		return p.Observe(ctx, kind, nativeName)
	}
	obs, err := nodes[0].ObserveChange(ctx, kind, nativeName, since, within)
	p.heard(nodes[0], err)
	if err == nil {
		obs.Members = memberReads([]read{{node: nodes[0], obs: obs}})
	}
	return obs, err
}

var (
	_ backend.ChangeObserver = (*pool)(nil)
	_ backend.Inventory      = (*pool)(nil)
)

// DeliverSecrets gives the values to the pool's one node. A pool of several takes sealed
// deliveries only: the values must not leave the Host once per node.
func (p *pool) DeliverSecrets(ctx context.Context, d backend.Delivery, values map[string]vocab.Secret) error {
	nodes, err := p.targets(ctx)
	if err != nil {
		return p.unlessEmpty(err)
	}
	if len(nodes) > 1 {
		return fmt.Errorf("%w: installation %s is a pool of %d nodes and names no poolPublicKey: a pool's secrets travel sealed to its pool key (takoserver nodes init-pool-key)",
			backend.ErrMisconfigured, p.inst.Name, len(nodes))
	}
	err = nodes[0].DeliverSecrets(ctx, d, values)
	p.heard(nodes[0], err)
	return err
}

// ReadbackSecrets asks every member for the challenge's digest, concluding nothing: one
// member's readback settles a delivery (each member that missed it gets it from the reconciler).
// Only when every member that may route answered that it does not hold it is the delivery
// concluded absent on each, so that a copy still on its way to any of them never lands; a member
// that did not answer leaves the readback undecided (an error).
func (p *pool) ReadbackSecrets(ctx context.Context, d backend.Delivery, challenge []byte) ([]byte, bool, error) {
	nodes, err := p.targets(ctx)
	if err != nil {
		return nil, false, p.unlessEmpty(err)
	}
	if len(nodes) == 1 {
		digest, ok, err := nodes[0].ReadbackSecrets(ctx, d, challenge)
		p.heard(nodes[0], err)
		return digest, ok, err
	}
	var errs []error
	for _, n := range nodes {
		digest, ok, err := n.readback(ctx, d, challenge, false, true)
		p.heard(n, err)
		if err == nil && ok {
			return digest, true, nil
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
		}
	}
	if len(errs) > 0 {
		return nil, false, fmt.Errorf("readback undecided: no node holds the delivery, and not every node answered: %w", errors.Join(errs...))
	}
	for _, n := range nodes {
		digest, ok, err := n.readback(ctx, d, challenge, true, true)
		p.heard(n, err)
		if err == nil && ok {
			return digest, true, nil // it landed meanwhile
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
		}
	}
	if len(errs) > 0 {
		return nil, false, fmt.Errorf("readback undecided: %w", errors.Join(errs...))
	}
	return nil, false, nil
}

func (p *pool) PoolSeal(d backend.Delivery, plaintext []byte) ([]byte, bool, error) {
	return (&runtimeNode{inst: p.inst}).PoolSeal(d, plaintext)
}

// DeliverSealed gives the blob to every member; it is delivered when one member took it (each
// member that missed it gets it from the reconciler).
func (p *pool) DeliverSealed(ctx context.Context, d backend.Delivery, blob []byte) error {
	// The pool is read afresh for a delivery (one round trip, once per delivery): a cached read may
	// still name a node retired or removed since, which must never be given a secret.
	nodes, err := p.targetsOf(ctx, true)
	if err != nil {
		return p.unlessEmpty(err)
	}
	var errs []error
	took := false
	for _, n := range nodes {
		if !p.writable(n) && len(nodes) > 1 {
			continue // named again by the reconciler later
		}
		err := n.DeliverSealed(ctx, d, blob)
		p.heard(n, err)
		if err != nil {
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
			continue
		}
		took = true
	}
	if took {
		return nil
	}
	return errors.Join(errs...)
}

// RestoreSealed names a kept blob again to the pool's one node (the reconciler restores each
// member through its own view).
func (p *pool) RestoreSealed(ctx context.Context, d backend.Delivery, blob []byte, replaces string) error {
	nodes, err := p.targets(ctx)
	if err != nil {
		return p.unlessEmpty(err)
	}
	if len(nodes) > 1 {
		views, err := p.Members(ctx)
		if err != nil {
			return err
		}
		if len(views) != 1 {
			return fmt.Errorf("selfhost backend: a restore names one node of the pool")
		}
		return views[0].(*runtimeNode).RestoreSealed(ctx, d, blob, replaces)
	}
	return nodes[0].RestoreSealed(ctx, d, blob, replaces)
}

var _ backend.PoolSink = (*pool)(nil)

// CheckDelivery refuses a delivery before its runtime input is claimed when a member that
// answers does not hold the pool's key, or no member answers.
func (p *pool) CheckDelivery(ctx context.Context) error {
	nodes, err := p.targets(ctx)
	if err != nil {
		return p.unlessEmpty(err)
	}
	answered := false
	var errs []error
	for _, n := range nodes {
		err := n.CheckDelivery(ctx)
		p.heard(n, err)
		switch {
		case err == nil:
			answered = true
		case errors.Is(err, backend.ErrUnreachable) && !p.mustTake(n):
		default:
			errs = append(errs, fmt.Errorf("node %s: %w", n.member.Name, err))
		}
	}
	if len(errs) == 0 && !answered {
		return fmt.Errorf("%w: installation %s: no node of the pool answers", backend.ErrUnreachable, p.inst.Name)
	}
	return errors.Join(errs...)
}

var _ backend.DeliveryCheck = (*pool)(nil)

// first is the member one-node work goes to (a cron tick, a log read): the first serving member
// that answers, or else the first that may route.
func (p *pool) first(ctx context.Context) (*runtimeNode, error) {
	nodes, err := p.targets(ctx)
	if err != nil {
		return nil, p.unlessEmpty(err)
	}
	for _, n := range nodes {
		if p.mustTake(n) {
			return n, nil
		}
	}
	return nodes[0], nil
}

// RunTick runs a cron tick on one member: a tick runs once, wherever.
func (p *pool) RunTick(ctx context.Context, t backend.Tick) (backend.TickOutcome, error) {
	n, err := p.first(ctx)
	if err != nil {
		return backend.TickOutcome{}, err
	}
	out, err := n.RunTick(ctx, t)
	p.heard(n, err)
	return out, err
}

var _ backend.CronRunner = (*pool)(nil)

// WorkerLogs reads a worker's logs from every member that may route: each node keeps the logs of
// the requests it served, so a pool's are merged. A read (not following) asks every member at once
// and hands on their entries in time order; a member that cannot be reached within logReadWait is
// left out, and the read fails when none can be reached or one refuses. Following, each member's
// new entries are handed on as they arrive, and a member whose stream ends is followed again,
// until ctx ends.
func (p *pool) WorkerLogs(ctx context.Context, scriptName string, workerUID uuid.UUID, q backend.LogQuery, each func(backend.LogEntry) error, flush func() error) error {
	nodes, err := p.targets(ctx)
	if err != nil {
		return p.unlessEmpty(err)
	}
	if len(nodes) == 1 {
		return nodes[0].WorkerLogs(ctx, scriptName, workerUID, q, each, flush)
	}
	if q.Follow {
		return p.followLogs(ctx, nodes, scriptName, workerUID, q, each, flush)
	}
	read := make([][]backend.LogEntry, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			rctx, cancel := context.WithTimeout(ctx, logReadWait)
			defer cancel()
			errs[i] = n.WorkerLogs(rctx, scriptName, workerUID, q, func(e backend.LogEntry) error {
				read[i] = append(read[i], e)
				return nil
			}, func() error { return nil })
			if errs[i] == nil && rctx.Err() != nil && ctx.Err() == nil {
				errs[i] = fmt.Errorf("%w: runtime node %s did not answer for the logs within %s", backend.ErrUnreachable, n.member.URL, logReadWait)
			}
			if ctx.Err() == nil {
				p.heard(n, errs[i])
			}
		})
	}
	wg.Wait()
	var merged []backend.LogEntry
	answered := 0
	for i := range nodes {
		switch {
		case errs[i] == nil:
			answered++
			merged = append(merged, read[i]...)
		case !errors.Is(errs[i], backend.ErrUnreachable):
			return fmt.Errorf("node %s: %w", nodes[i].member.Name, errs[i]) // a refusal is not silence
		}
	}
	if answered == 0 {
		return fmt.Errorf("no node of the pool answered for the logs: %w", errors.Join(errs...))
	}
	slices.SortStableFunc(merged, func(a, b backend.LogEntry) int { return a.Time.Compare(b.Time) })
	for _, e := range merged {
		if err := each(e); err != nil {
			return err
		}
	}
	return flush()
}

// logReadWait bounds one member's part of a log read (not following): a member that does not
// answer in time is left out, as one that cannot be reached.
const logReadWait = 10 * time.Second

// followLogs follows every member's logs at once, handing each entry on from one goroutine. flush
// runs at once, whenever no entry is pending, and every second besides, so that the caller's
// stream opens and its checks (is the worker still there?) run on a quiet worker too. A member
// whose stream ends is followed again after a second, until ctx ends.
func (p *pool) followLogs(ctx context.Context, nodes []*runtimeNode, scriptName string, workerUID uuid.UUID, q backend.LogQuery, each func(backend.LogEntry) error, flush func() error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	entries := make(chan backend.LogEntry, 256)
	for _, n := range nodes {
		go func() {
			since := q
			for {
				err := n.WorkerLogs(ctx, scriptName, workerUID, since, func(e backend.LogEntry) error {
					select {
					case entries <- e:
						if !e.Time.IsZero() {
							since.Since = e.Time.Add(time.Nanosecond) // followed again: from after the last entry
						}
						return nil
					case <-ctx.Done():
						return ctx.Err()
					}
				}, func() error { return nil })
				if ctx.Err() != nil {
					return
				}
				p.heard(n, err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
			}
		}()
	}
	if err := flush(); err != nil {
		return err
	}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e := <-entries:
			if err := each(e); err != nil {
				return err
			}
			if len(entries) == 0 {
				if err := flush(); err != nil {
					return err
				}
			}
		case <-tick.C:
			if err := flush(); err != nil {
				return err
			}
		}
	}
}

// Holdings lists what the pool's one node holds; the reconciler lists a pool of several member by
// member (Members).
func (p *pool) Holdings(ctx context.Context) (backend.Holdings, error) {
	views, err := p.Members(ctx)
	if err != nil {
		return backend.Holdings{}, err
	}
	if len(views) != 1 {
		return backend.Holdings{}, fmt.Errorf("selfhost backend: a pool of %d nodes is listed member by member", len(views))
	}
	n := views[0].(*runtimeNode)
	h, err := n.Holdings(ctx)
	p.heard(n, err)
	return h, err
}

// Members are the pool's joining and serving members, each as a mutator of that node alone, for
// the node reconciler to bring each up to date on its own.
func (p *pool) Members(ctx context.Context) ([]backend.Mutator, error) {
	nodes, err := p.targetsOf(ctx, true)
	if err != nil {
		return nil, err
	}
	var out []backend.Mutator
	for _, n := range nodes {
		// A draining member is on its way out: nothing is written to it again. A member that
		// joined moments ago is left until it has settled.
		if (n.member.State == backend.MemberJoining || n.member.State == backend.MemberServing) && n.member.Settled {
			out = append(out, n)
		}
	}
	return out, nil
}

var _ backend.PoolInventory = (*pool)(nil)

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

// announceWait bounds telling one member its place: a lost node must not hold the sweep.
const announceWait = 2 * time.Second

// Announce tells each member of the pool its place (SPEC 6.2), retired and removed ones too if
// they answer; the members in caughtUp are confirmed, the others are not.
func (p *pool) Announce(ctx context.Context, caughtUp map[string]string) error {
	if p.members == nil {
		return nil
	}
	members, err := p.read(ctx, true)
	if err != nil {
		return err
	}
	size := 0
	for _, m := range members {
		if m.MayRoute() {
			size++
		}
	}
	// Every member is told its place on every sweep (a node that missed its drain, or that has
	// just joined, learns it); only one found wholly up to date is confirmed. All at once, so
	// that lost and retired nodes that never answer hold a sweep for announceWait at most,
	// however many the pool has had.
	errs := make([]error, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		if m.Implicit {
			continue
		}
		wg.Go(func() {
			n := &runtimeNode{inst: p.inst, log: p.log, shared: p.shared, member: m}
			actx, cancel := context.WithTimeout(ctx, announceWait)
			defer cancel()
			if err := n.announce(actx, size, caughtUp[m.Name]); err != nil && m.MayRoute() {
				errs[i] = fmt.Errorf("node %s: tell it its place in the pool: %w", m.Name, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

var _ backend.PoolAnnouncer = (*pool)(nil)

// membership is what the member is told of its place in the pool of size members that may route;
// confirms names the start of it the Host found wholly up to date ("" confirms nothing).
func (n *runtimeNode) membership(size int, confirms string) adminapi.Membership {
	fence := n.inst.Fence()
	if n.member.Fence != nil {
		fence = *n.member.Fence // the pool's, recorded: every replica tells the same
	}
	m := adminapi.Membership{Pool: n.inst.Name, Node: n.member.Name, State: n.member.State, Epoch: max(n.member.Epoch, 1),
		PoolSize: size, FenceSeconds: int(fence.Seconds()), Confirms: confirms}
	if m.State == backend.MemberDraining {
		since := n.member.Since
		m.DrainingSince = &since
	}
	return m
}

// announce tells the member its place in the pool.
func (n *runtimeNode) announce(ctx context.Context, size int, confirms string) error {
	c, err := n.api(ctx)
	if err != nil {
		return err
	}
	_, err = c.SetMembership(ctx, n.membership(size, confirms))
	return wrap(c, err)
}

// Tell tells the member named name its place now (a drain takes effect on the node at once).
func Tell(ctx context.Context, inst catalog.Installation, members []backend.PoolMember, name string) (adminapi.MembershipStatus, error) {
	size := 0
	var target *backend.PoolMember
	for i, m := range members {
		if m.MayRoute() {
			size++
		}
		if m.Name == name {
			target = &members[i]
		}
	}
	if target == nil {
		return adminapi.MembershipStatus{}, fmt.Errorf("no member %s in pool %s", name, inst.Name)
	}
	n := &runtimeNode{inst: inst, shared: &shared{clients: map[string]*Client{}, poolOK: map[string]time.Time{}, silentSince: map[string]time.Time{}}, member: *target}
	c, err := n.api(ctx)
	if err != nil {
		return adminapi.MembershipStatus{}, err
	}
	return c.SetMembership(ctx, n.membership(size, ""))
}

// Implicit reports whether the node is the catalog's node of a pool without membership rows.
func (n *runtimeNode) Implicit() bool { return n.member.Implicit }
