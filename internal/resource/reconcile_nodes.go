package resource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Reconciled is one change the reconciler made on a node, as recorded in node_reconciliations.
type Reconciled struct {
	Installation string
	Kind         string
	NativeName   string
	Action       dbsqlc.NodeReconciliationAction
	DeploymentID string
	ResourceUID  string
	Organization string
	Detail       string
}

// reconcileRewrites bounds the objects one sweep writes again on one node; the next sweep goes on.
const reconcileRewrites = 200

// reconcileLockHold bounds one rewrite, for which the reconciler holds its worker's or
// endpoint's row: a request waiting on that row gives up after 2 s (its lock_timeout).
const reconcileLockHold = 1500 * time.Millisecond

// ReconcileNodes puts every runtime node back to what the ledger says (SPEC 6.2, issue 34). It
// lists what each node holds and compares it with the ledger:
//   - an object whose deployment the ledger has no record of was written under a ledger this
//     database no longer has (a restore to an earlier point): it is taken down (fenced), so that
//     no origin serves code the ledger does not know, whoever's it is;
//   - an object whose deployment the ledger records as deleted, of a deleted worker or endpoint,
//     came back with the node (an old backup): it is taken down (removed);
//   - a live worker's current deployment or a live endpoint's route that the node lacks, or holds
//     only an older deployment of, is written again (restored), its worker's or endpoint's row
//     locked meanwhile so that no update or delete of it interleaves.
//
// Every take-down is compare-and-delete on the object's own worker or endpoint UID. Deliveries of
// secret values are not restored: the Host gave them away once (SPEC 3.5), so such a worker reads
// not Ready until its runtime input is delivered again. It reports what it changed; objects it
// could not change are retried at the next sweep, and their errors are joined.
func (s *Service) ReconcileNodes(ctx context.Context, db interface {
	store.Beginner
	dbsqlc.DBTX
}) ([]Reconciled, error) {
	var out []Reconciled
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(s.Catalog.Installations)) {
		inst := s.Catalog.Installations[name]
		if inst.Pack != catalog.PackSelfhost {
			continue
		}
		mut, err := s.Backends.Mutator(inst)
		if err != nil {
			continue
		}
		nodes, err := poolNodes(ctx, mut)
		if err != nil {
			errs = append(errs, fmt.Errorf("installation %s: %w", name, err))
			continue
		}
		caughtUps := map[string]string{}
		for _, node := range nodes {
			inv, ok := backend.As[backend.Inventory](node)
			if !ok {
				continue
			}
			done, caughtUp, boot, err := s.reconcileNode(ctx, db, name, node, inv, len(nodes) > 1)
			out = append(out, done...)
			if err != nil {
				errs = append(errs, fmt.Errorf("installation %s: %w", name, err))
				continue
			}
			if caughtUp != "" {
				// A joining member this sweep found wholly up to date serves from now on.
				if _, err := nodepool.MarkServing(ctx, db, inst, caughtUp); err != nil {
					errs = append(errs, fmt.Errorf("installation %s: %w", name, err))
					continue
				}
				caughtUps[caughtUp] = boot
			}
		}
		// Each member found up to date is confirmed in its place (a member of a pool of two or
		// more serves nothing after a restart until then); retired members are told so.
		if a, ok := backend.As[backend.PoolAnnouncer](mut); ok {
			if err := a.Announce(ctx, caughtUps); err != nil {
				errs = append(errs, fmt.Errorf("installation %s: %w", name, err))
			}
		}
	}
	return out, errors.Join(errs...)
}

// poolNodes are the mutators the reconciler brings up to date one by one: each member of a pool
// of several (SPEC 6.2), or the installation's mutator itself.
func poolNodes(ctx context.Context, mut backend.Mutator) ([]backend.Mutator, error) {
	p, ok := backend.As[backend.PoolInventory](mut)
	if !ok {
		return []backend.Mutator{mut}, nil
	}
	members, err := p.Members(ctx)
	switch {
	case errors.Is(err, backend.ErrPoolEmpty) || (err == nil && len(members) == 0):
		return nil, nil // every node was retired, or is draining: none to bring up to date
	case err != nil:
		return nil, err
	case len(members) == 1:
		if n, ok := members[0].(interface{ Implicit() bool }); ok && n.Implicit() {
			// A pool without rows, as before pools: through the Registry's wrappers, as every call.
			return []backend.Mutator{mut}, nil
		}
	}
	return members, nil
}

// heldKey names one native object.
type heldKey struct{ kind, name string }

func (s *Service) reconcileNode(ctx context.Context, db interface {
	store.Beginner
	dbsqlc.DBTX
}, installation string, mut backend.Mutator, inv backend.Inventory, pooled bool) ([]Reconciled, string, string, error) {
	// What the node holds is read first: every deployment is in the ledger before any node is
	// asked to hold it, so one the ledger lacks after this read was never the ledger's.
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	held, err := inv.Holdings(lctx)
	cancel()
	if errors.Is(err, backend.ErrPoolEmpty) {
		return nil, "", "", nil // every node was retired: none to bring up to date
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("list what the node holds: %w", err)
	}
	q := dbsqlc.New(db)
	ids := make([]uuid.UUID, 0, len(held.Objects))
	for _, h := range held.Objects {
		if h.DeploymentID != uuid.Nil {
			ids = append(ids, h.DeploymentID)
		}
	}
	rows, err := q.ReconcileKnown(ctx, ids)
	if err != nil {
		return nil, "", "", fmt.Errorf("resource: deployments a node holds: %w", store.Classify(err))
	}
	known := make(map[uuid.UUID]dbsqlc.ReconcileKnownRow, len(rows))
	for _, r := range rows {
		known[r.ID] = r
	}
	if err := q.DeploymentSequenceAdvance(ctx, held.GenerationFloor); err != nil {
		return nil, "", "", fmt.Errorf("resource: move generations past the node's: %w", store.Classify(err))
	}

	var out []Reconciled
	var errs []error
	note := func(r Reconciled, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", r.Kind, r.NativeName, err))
			return
		}
		out = append(out, r)
	}
	holds := map[heldKey]backend.Held{}
	for _, h := range held.Objects {
		k, ok := known[h.DeploymentID]
		switch {
		case !ok:
			note(s.takeDown(ctx, db, installation, mut, h, dbsqlc.NodeReconciliationActionFenced,
				"the ledger has no record of this deployment (a database restored to an earlier point?)"))
		case k.Status == dbsqlc.DeploymentStatusDeleted && k.ResourceDeleted && !k.InFlight:
			note(s.takeDown(ctx, db, installation, mut, h, dbsqlc.NodeReconciliationActionRemoved,
				"the ledger records this deployment deleted (a node restored from an older backup?)"))
		default:
			holds[heldKey{h.Kind, h.NativeName}] = h
		}
	}

	current, err := q.ReconcileCurrent(ctx, installation)
	if err != nil {
		return out, "", "", errors.Join(append(errs, fmt.Errorf("resource: what the node must hold: %w", store.Classify(err)))...)
	}
	// Scripts before routes, so that a route written again finds its script.
	slices.SortStableFunc(current, func(a, b dbsqlc.ReconcileCurrentRow) int {
		return boolOrder(a.ResourceKind == dbsqlc.ResourceKindWorkerEndpoint) - boolOrder(b.ResourceKind == dbsqlc.ResourceKindWorkerEndpoint)
	})
	rewrites, capped := 0, false
	for _, c := range current {
		h, present := holds[heldKey{nativeKind(c.ResourceKind), c.NativeName}]
		// Behind: it holds a deployment the ledger deleted, or, in a pool of several, one that
		// failed and that no operation works on (a member took it while the others refused it).
		heldStatus := known[h.DeploymentID]
		behind := present && h.DeploymentID != c.ID && (heldStatus.Status == dbsqlc.DeploymentStatusDeleted ||
			(pooled && heldStatus.Status == dbsqlc.DeploymentStatusFailed && !heldStatus.InFlight))
		if present && !behind {
			continue // its own, or a newer, failed or in-flight deployment: its operation's to settle
		}
		if rewrites == reconcileRewrites {
			capped = true
			break
		}
		rewrites++
		r, err := s.rewrite(ctx, db, installation, inv, c)
		if r != nil || err != nil {
			note(orZero(r, Reconciled{Kind: nativeKind(c.ResourceKind), NativeName: c.NativeName}), err)
		}
		if err == nil && r != nil && !present && r.Kind == backend.NativeWorker {
			// Written on a node that lacked it: it holds no delivery yet, and gets one below.
			holds[heldKey{r.Kind, r.NativeName}] = backend.Held{Kind: r.Kind, NativeName: r.NativeName, DeploymentID: uuid.MustParse(r.DeploymentID),
				ResourceUID: r.ResourceUID, Organization: r.Organization}
		}
	}
	if pool, ok := backend.As[backend.PoolSink](mut); ok {
		errs = append(errs, s.restoreDeliveries(ctx, db, installation, pool, holds, note))
	}
	err = errors.Join(errs...)
	if err != nil || capped || len(out) > 0 {
		// Caught up only after a sweep that found nothing to change: what this one wrote is
		// then on the node.
		return out, "", "", err
	}
	return out, held.Node, held.Boot, nil
}

// restoreDeliveries names again, to a node that holds a live worker's script without any
// delivery (its state was lost, or restored from before the delivery) or with one the worker's
// newest superseded (restored from an old backup), the worker's newest
// settled delivery the Host keeps sealed to the pool (SPEC 6.2): the node opens it with the pool
// key, so the worker gets its secrets back with no tenant action, and the Host never opens it.
// The node takes it only if it still holds what was read (a newer delivery may have arrived
// meanwhile). A script the node lacks gets its delivery at the next sweep, once
// written again.
func (s *Service) restoreDeliveries(ctx context.Context, db interface {
	store.Beginner
	dbsqlc.DBTX
}, installation string, pool backend.PoolSink, holds map[heldKey]backend.Held, note func(Reconciled, error)) error {
	rows, err := dbsqlc.New(db).ReconcileDeliveries(ctx, &installation)
	if err != nil {
		return fmt.Errorf("resource: the deliveries a node must hold: %w", store.Classify(err))
	}
	latest := map[uuid.UUID]dbsqlc.ReconcileDeliveriesRow{}
	for _, r := range rows {
		latest[r.WorkerUID] = r // ordered by settled_at: the newest wins
	}
	for _, r := range rows {
		if latest[r.WorkerUID].MaterialSetID != r.MaterialSetID {
			continue
		}
		h, held := holds[heldKey{backend.NativeWorker, r.NativeName}]
		if !held || h.ResourceUID != r.WorkerUID.String() || (h.DeliveryID != "" && !slices.Contains(r.Superseded, h.DeliveryID)) {
			continue // not the worker's script, or it holds this delivery, or one newer or in flight
		}
		d := backend.Delivery{ScriptName: r.NativeName, WorkerUID: r.WorkerUID, PreparationID: r.PreparationID, MaterialSetID: r.MaterialSetID,
			SecretNames: r.BindingNames, EffectID: uuid.New()}
		detail := "the worker's secret delivery " + r.MaterialSetID.String() + ", which the node lacked, from its pool blob"
		if h.DeliveryID != "" {
			detail = "the worker's secret delivery " + r.MaterialSetID.String() + " in place of " + h.DeliveryID + ", which it superseded, from its pool blob"
		}
		rec := Reconciled{Installation: installation, Kind: backend.NativeWorker, NativeName: r.NativeName, Action: dbsqlc.NodeReconciliationActionRestored,
			DeploymentID: h.DeploymentID.String(), ResourceUID: h.ResourceUID, Organization: h.Organization, Detail: detail}
		dctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
		err := pool.RestoreSealed(dctx, d, r.PoolBlob, h.DeliveryID)
		cancel()
		if errors.Is(err, backend.ErrNotRestored) {
			continue // a newer delivery got there first, or the script went: nothing to record
		}
		if err != nil {
			note(rec, fmt.Errorf("deliver it again: %w", err))
			continue
		}
		note(rec, s.recordReconciled(ctx, db, rec, h.Generation))
	}
	return nil
}

func boolOrder(b bool) int {
	if b {
		return 1
	}
	return 0
}

func orZero(r *Reconciled, fallback Reconciled) Reconciled {
	if r == nil {
		return fallback
	}
	return *r
}

// takeDown removes h from the node (compare-and-delete on its own worker or endpoint UID) and
// records why.
func (s *Service) takeDown(ctx context.Context, db store.Beginner, installation string, mut backend.Mutator, h backend.Held, action dbsqlc.NodeReconciliationAction, why string) (Reconciled, error) {
	r := Reconciled{Installation: installation, Kind: h.Kind, NativeName: h.NativeName, Action: action,
		DeploymentID: h.DeploymentID.String(), ResourceUID: h.ResourceUID, Organization: h.Organization, Detail: why}
	uid, err := uuid.Parse(h.ResourceUID)
	if err != nil {
		return r, fmt.Errorf("the node records it for %q, which is no UID of a Host's: left for an operator", h.ResourceUID)
	}
	dctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	err = mut.Delete(dctx, backend.Desired{Kind: h.Kind, NativeName: h.NativeName, DeploymentID: h.DeploymentID, EffectID: uuid.New(),
		ResourceUID: uid, ScriptName: h.ScriptName})
	cancel()
	if err != nil {
		return r, fmt.Errorf("take it down: %w", err)
	}
	return r, s.recordReconciled(ctx, db, r, h.Generation)
}

// rewrite writes c again on the node, holding its worker's or endpoint's row so that no update
// or delete of it interleaves; nothing when the row no longer says c is current.
func (s *Service) rewrite(ctx context.Context, db store.Beginner, installation string, inv backend.Inventory, c dbsqlc.ReconcileCurrentRow) (*Reconciled, error) {
	var out *Reconciled
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '1s'"); err != nil {
			return err
		}
		q := dbsqlc.New(tx)
		d, generation, ok, err := desiredAgain(ctx, q, c)
		if err != nil || !ok {
			return err
		}
		d.EffectID = uuid.New()
		wctx, cancel := context.WithTimeout(ctx, reconcileLockHold)
		err = inv.Rewrite(wctx, d)
		cancel()
		r := Reconciled{Installation: installation, Kind: d.Kind, NativeName: d.NativeName, Action: dbsqlc.NodeReconciliationActionRestored,
			DeploymentID: d.DeploymentID.String(), ResourceUID: d.ResourceUID.String(), Organization: d.Labels.Organization,
			Detail: "the ledger's current deployment, which the node lacked"}
		out = &r
		if err != nil {
			return fmt.Errorf("write it again: %w", err)
		}
		return recordIn(ctx, q, r, generation)
	})
	return out, err
}

// desiredAgain locks c's worker or endpoint and rebuilds what its deployment writes; ok is false
// when the row no longer says c is current.
func desiredAgain(ctx context.Context, q *dbsqlc.Queries, c dbsqlc.ReconcileCurrentRow) (backend.Desired, int64, bool, error) {
	if c.ResourceKind == dbsqlc.ResourceKindWorkerEndpoint {
		e, err := q.ReconcileLockEndpoint(ctx, dbsqlc.ReconcileLockEndpointParams{UID: c.ResourceUID, DeploymentID: c.ID})
		if errors.Is(err, pgx.ErrNoRows) {
			return backend.Desired{}, 0, false, nil
		}
		if err != nil {
			return backend.Desired{}, 0, false, store.Classify(err)
		}
		if c.RouteScript == nil {
			return backend.Desired{}, 0, false, fmt.Errorf("route deployment %s names no script", c.ID)
		}
		return backend.Desired{Kind: backend.NativeRoute, NativeName: c.NativeName, DeploymentID: c.ID, ResourceUID: e.UID, Sequence: c.Seq,
			ScriptName: *c.RouteScript, Labels: backend.Labels{Organization: e.OrganizationName, Space: e.Space, Worker: e.WorkerName}}, c.Seq, true, nil
	}
	w, err := q.ReconcileLockWorker(ctx, dbsqlc.ReconcileLockWorkerParams{UID: c.ResourceUID, DeploymentID: c.ID})
	if errors.Is(err, pgx.ErrNoRows) {
		return backend.Desired{}, 0, false, nil
	}
	if err != nil {
		return backend.Desired{}, 0, false, store.Classify(err)
	}
	b := &backend.Bundle{MainModule: w.MainModule, CompatibilityDate: w.CompatibilityDate}
	if err := json.Unmarshal(w.Modules, &b.Modules); err != nil {
		return backend.Desired{}, 0, false, err
	}
	if err := json.Unmarshal(w.Settings, &b.Settings); err != nil {
		return backend.Desired{}, 0, false, err
	}
	return backend.Desired{Kind: backend.NativeWorker, NativeName: w.ScriptName, DeploymentID: c.ID, ResourceUID: w.UID, Sequence: w.Seq,
		Labels: backend.Labels{Organization: w.OrganizationName, Space: w.Space, Worker: w.Name}, Bundle: b, SecretNames: w.RequiredSensitiveVars}, w.Seq, true, nil
}

func (s *Service) recordReconciled(ctx context.Context, db store.Beginner, r Reconciled, generation int64) error {
	return store.WithTx(ctx, db, func(tx pgx.Tx) error { return recordIn(ctx, dbsqlc.New(tx), r, generation) })
}

func recordIn(ctx context.Context, q *dbsqlc.Queries, r Reconciled, generation int64) error {
	kind := "worker"
	if r.Kind == backend.NativeRoute {
		kind = "endpoint"
	}
	err := q.NodeReconciliationRecord(ctx, dbsqlc.NodeReconciliationRecordParams{
		ID: uuid.Must(uuid.NewV7()), Installation: r.Installation, NativeKind: kind, NativeName: r.NativeName, Action: r.Action,
		DeploymentID: r.DeploymentID, ResourceUID: r.ResourceUID, Organization: r.Organization, Generation: generation, Detail: r.Detail,
	})
	if err != nil {
		return fmt.Errorf("resource: record a node reconciliation: %w", store.Classify(err))
	}
	return nil
}
