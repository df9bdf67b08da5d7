package resource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/nodepool"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// planned is a deployment and its effect, recorded as dispatched in the transaction that planned
// it, and carried out by one backend call after that transaction commits.
type planned struct {
	deployment uuid.UUID
	effect     uuid.UUID
	action     dbsqlc.EffectAction
	desired    backend.Desired
	placement  Placement
}

// outcome is what the backend call of one planned effect left on the backend, as read back.
type outcome struct {
	pl planned
	// done: an apply the backend admitted, or a delete after which the object no longer holds
	// this deployment.
	done bool
	// present: the backend holds this deployment (whether or not it admitted it).
	present bool
	// unknown: neither the call nor the read-back got an answer, so the backend may hold the
	// deployment or not. An unknown apply of a create is undone like a present one.
	unknown bool
	// late: the apply's call got no answer that it was refused, so on a pack without fences it
	// may still land after this read (late_writes.go).
	late bool
	obs  backend.Observation
	err  error
}

// mayHold reports whether the backend may hold what the outcome's apply wrote.
func (o outcome) mayHold() bool { return o.present || o.unknown }

func planApply(ctx context.Context, q *dbsqlc.Queries, m *ownership.Mutation, org string, kind dbsqlc.ResourceKind, uid uuid.UUID, generation int64, p Placement, d backend.Desired) (planned, error) {
	pl := planned{deployment: uuid.New(), effect: uuid.New(), action: dbsqlc.EffectActionApply, desired: d, placement: p}
	var routeScript *string
	if kind == dbsqlc.ResourceKindWorkerEndpoint {
		routeScript = &d.ScriptName
	}
	seq, err := q.DeploymentInsert(ctx, dbsqlc.DeploymentInsertParams{
		ID: pl.deployment, OrganizationID: org, ResourceKind: kind, ResourceUID: uid, Generation: generation,
		NativeName: d.NativeName, OfferingID: p.OfferingID, OfferingDigest: p.OfferingDigest, Pack: p.Pack, Installation: p.Installation,
		RouteScript: routeScript,
	})
	if err != nil {
		return planned{}, fmt.Errorf("resource: plan deployment: %w", err)
	}
	pl.desired.DeploymentID, pl.desired.EffectID, pl.desired.Sequence = pl.deployment, pl.effect, seq
	if err := planEffect(ctx, q, p, pl.effect, m.Operation, pl.deployment, dbsqlc.EffectActionApply); err != nil {
		return planned{}, err
	}
	return pl, nil
}

// planEffect records a deployment's effect as dispatched and, on a pool, one under it for each
// member that may route (SPEC 6.2), read from the membership rows in this transaction, which
// holds the pool's lock shared until it commits (a node command waits for it).
func planEffect(ctx context.Context, q *dbsqlc.Queries, p Placement, effect, operation, deployment uuid.UUID, action dbsqlc.EffectAction) error {
	if err := q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: effect, OperationID: operation, DeploymentID: deployment, Action: action, Status: dbsqlc.EffectStatusDispatched}); err != nil {
		return fmt.Errorf("resource: plan effect: %w", err)
	}
	if p.Pack != catalog.PackSelfhost {
		return nil
	}
	if err := q.RuntimeNodesShareLock(ctx, nodepool.LockKey(p.Installation)); err != nil {
		return fmt.Errorf("resource: hold the pool's lock: %w", err)
	}
	if err := q.EffectsPlanMembers(ctx, effect); err != nil {
		return fmt.Errorf("resource: plan the pool members' effects: %w", err)
	}
	return nil
}

// settleMembers ends the pool members' effects under parent as each member answered the
// outcome's read; a member the read did not reach ends failed.
func settleMembers(ctx context.Context, q *dbsqlc.Queries, parent uuid.UUID, o outcome) error {
	for _, m := range o.obs.Members {
		status, detail := dbsqlc.EffectStatusFailed, memberShortfall(o, m)
		if detail == nil {
			status = dbsqlc.EffectStatusSucceeded
		}
		if _, err := q.EffectMemberSettle(ctx, dbsqlc.EffectMemberSettleParams{ParentID: parent, Node: m.Name, Status: status, Detail: detail}); err != nil {
			return fmt.Errorf("resource: settle the effect on node %s: %w", m.Name, err)
		}
	}
	detail := "the pool's read did not reach this node"
	if err := q.EffectMembersUnsettled(ctx, dbsqlc.EffectMembersUnsettledParams{ParentID: parent, Status: dbsqlc.EffectStatusFailed, Detail: &detail}); err != nil {
		return fmt.Errorf("resource: settle the pool members' effects: %w", err)
	}
	return nil
}

// memberShortfall says why member m does not confirm the outcome's effect (nil: it does): a
// delete's absence, an apply's admission of the deployment.
func memberShortfall(o outcome, m backend.MemberRead) *string {
	var why string
	switch {
	case m.Err != "":
		why = "no answer: " + m.Err
	case o.pl.action == dbsqlc.EffectActionDelete && m.Holds(o.pl.deployment):
		why = "the node still holds the deployment"
	case o.pl.action == dbsqlc.EffectActionDelete:
		return nil
	case m.Holds(o.pl.deployment) && m.Admitted:
		return nil
	case m.Holds(o.pl.deployment):
		why = "the node holds the deployment but has not admitted it"
	default:
		why = "the node does not hold the deployment"
	}
	return &why
}

// deployed rebuilds what a recorded deployment of a resource of kind wrote, for its delete or its
// read-back.
func deployed(kind dbsqlc.ResourceKind, deployment, resource uuid.UUID, native string, seq int64, routeScript *string) backend.Desired {
	d := backend.Desired{Kind: nativeKind(kind), NativeName: native, DeploymentID: deployment, ResourceUID: resource, Sequence: seq}
	if routeScript != nil {
		d.ScriptName = *routeScript
	}
	return d
}

// nativeKind is what the backend holds for a resource of kind: a worker's script, an endpoint's
// route.
func nativeKind(kind dbsqlc.ResourceKind) string {
	if kind == dbsqlc.ResourceKindWorkerEndpoint {
		return backend.NativeRoute
	}
	return backend.NativeWorker
}

// planDeletes moves every open deployment of uid to deleting and plans one delete effect each.
func planDeletes(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID, kind dbsqlc.ResourceKind, uid uuid.UUID, p Placement) ([]planned, error) {
	open, err := q.DeploymentsOpen(ctx, uid)
	if err != nil {
		return nil, fmt.Errorf("resource: open deployments: %w", err)
	}
	var out []planned
	for _, d := range open {
		pl := planned{deployment: d.ID, effect: uuid.New(), action: dbsqlc.EffectActionDelete, placement: p,
			desired: deployed(kind, d.ID, uid, d.NativeName, d.Seq, d.RouteScript)}
		pl.desired.EffectID = pl.effect
		if _, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: d.ID, Status: dbsqlc.DeploymentStatusDeleting,
			FromStatuses: texts(dbsqlc.DeploymentStatusPending, dbsqlc.DeploymentStatusActive, dbsqlc.DeploymentStatusDeleting)}); err != nil {
			return nil, fmt.Errorf("resource: mark deployment deleting: %w", err)
		}
		if err := planEffect(ctx, q, p, pl.effect, operation, d.ID, dbsqlc.EffectActionDelete); err != nil {
			return nil, err
		}
		out = append(out, pl)
	}
	return out, nil
}

// perform makes the backend call of one planned effect and reads the result back; it never runs
// inside a transaction. Absence after a delete and admission after an apply are confirmed by
// reading back, not assumed from the call.
func perform(ctx context.Context, mut backend.Mutator, pl planned) outcome {
	ctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	defer cancel()
	if pl.action == dbsqlc.EffectActionApply {
		obs, err := mut.Apply(ctx, pl.desired)
		unknown := false
		if err != nil {
			// Whether the failed call landed is for the read-back to say, on a context of its own
			// (the call may have used up this one).
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), BackendCallTimeout)
			again, rerr := mut.Observe(rctx, pl.desired.Kind, pl.desired.NativeName)
			rcancel()
			if rerr == nil {
				obs = again
			} else {
				unknown = true
			}
		}
		holds := obs.Holds(pl.deployment)
		o := outcome{pl: pl, present: holds, unknown: unknown, done: holds && obs.Admitted, obs: obs, err: err, late: backend.MayLandLate(err)}
		switch {
		case o.done:
			o.err = nil // it landed and was admitted, whatever the call said
		case o.err == nil && holds && obs.Failed:
			o.err = fmt.Errorf("the backend could not start it: %s", obs.Message)
		case o.err == nil && holds:
			o.err = errors.New("the backend did not make it Ready in time (it keeps trying; apply again)")
		case o.err == nil:
			o.err = errors.New("the backend does not hold the deployment after applying it")
		}
		return o
	}
	callErr := mut.Delete(ctx, pl.desired)
	obs, err := mut.Observe(ctx, pl.desired.Kind, pl.desired.NativeName)
	if err != nil {
		if callErr == nil {
			callErr = err
		}
		return outcome{pl: pl, present: true, err: callErr} // a delete is never assumed done
	}
	holds := obs.Holds(pl.deployment)
	if holds && callErr == nil {
		callErr = errors.New("the native object is still present after delete")
	}
	return outcome{pl: pl, done: !holds, present: holds, obs: obs, err: callErr}
}

// record writes an outcome into the ledger by compare-and-swap on the effect's status: an apply
// the backend admitted makes its deployment active (and supersedes older ones), one it did not
// fails it; a delete that took the object away makes it deleted, one that did not leaves it
// deleting.
func record(ctx context.Context, q *dbsqlc.Queries, o outcome, resourceUID uuid.UUID) error {
	var detail *string
	if o.err != nil {
		d := o.err.Error()
		detail = &d
	}
	status := dbsqlc.EffectStatusFailed
	if o.done {
		status = dbsqlc.EffectStatusSucceeded
	}
	if _, err := q.EffectSetStatus(ctx, dbsqlc.EffectSetStatusParams{ID: o.pl.effect, Status: status, Detail: detail,
		FromStatuses: texts(dbsqlc.EffectStatusPlanned, dbsqlc.EffectStatusDispatched)}); err != nil {
		return fmt.Errorf("resource: settle effect: %w", err)
	}
	if err := settleMembers(ctx, q, o.pl.effect, o); err != nil {
		return err
	}
	if err := recordDeployment(ctx, q, o, resourceUID); err != nil {
		return err
	}
	if o.done && o.pl.desired.Kind == backend.NativeWorker {
		// A deployment that stopped being active needs its kept bundle no more.
		if err := q.WorkerKeptBundlesPrune(ctx, resourceUID); err != nil {
			return fmt.Errorf("resource: prune kept bundles: %w", err)
		}
	}
	return nil
}

// recordDeployment moves the outcome's deployment on by compare-and-swap on its status.
func recordDeployment(ctx context.Context, q *dbsqlc.Queries, o outcome, resourceUID uuid.UUID) error {
	switch {
	case o.pl.action == dbsqlc.EffectActionApply && o.done:
		if _, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: dbsqlc.DeploymentStatusActive,
			FromStatuses: texts(dbsqlc.DeploymentStatusPending)}); err != nil {
			return fmt.Errorf("resource: activate deployment: %w", err)
		}
		return q.DeploymentSupersede(ctx, dbsqlc.DeploymentSupersedeParams{ResourceUID: resourceUID, ID: o.pl.deployment})
	case o.pl.action == dbsqlc.EffectActionApply:
		_, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: dbsqlc.DeploymentStatusFailed,
			FromStatuses: texts(dbsqlc.DeploymentStatusPending)})
		return err
	case o.done:
		// Deleted only if every member of its pool that may route confirmed it (a member added
		// while the delete ran holds it deleting: the request is refused, and a retry asks it).
		deleted, err := q.DeploymentDeletedEverywhere(ctx, dbsqlc.DeploymentDeletedEverywhereParams{ID: o.pl.deployment, EffectID: o.pl.effect})
		if err != nil || !deleted {
			return err
		}
		return recordLingering(ctx, q, o)
	}
	return nil
}

// recordLingering persists, with the readback that found a route gone, how long the backend's
// edge may still route it (SPEC 8): until then fence deployment_live holds, and the deletion
// attestation, closed after it, stays open (migration 11).
func recordLingering(ctx context.Context, q *dbsqlc.Queries, o outcome) error {
	if !o.done || o.obs.Lingers <= 0 {
		return nil
	}
	if err := q.DeploymentRoutedUntil(ctx, dbsqlc.DeploymentRoutedUntilParams{ID: o.pl.deployment, Seconds: o.obs.Lingers.Seconds()}); err != nil {
		return fmt.Errorf("resource: record route propagation: %w", err)
	}
	return nil
}

// recordCompensation writes a compensating delete into the ledger: a delete effect of the
// deployment, and the deployment deleted when the backend confirmed it, or left deleting for the
// janitor. One the backend did not confirm is recorded under an operation of its own, committed,
// so that every fence counts the deployment as live (the refused operation it undoes would not)
// until the janitor confirms its absence.
func recordCompensation(ctx context.Context, q *dbsqlc.Queries, org string, operation uuid.UUID, o outcome) (deleted bool, err error) {
	if o.done {
		// Confirmed by the pack, and, on a pool, by every member that may route now.
		effect := uuid.New()
		if err := q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: effect, OperationID: operation, DeploymentID: o.pl.deployment, Action: dbsqlc.EffectActionDelete, Status: dbsqlc.EffectStatusSucceeded}); err != nil {
			return false, err
		}
		if err := settleMembers(ctx, q, effect, o); err != nil {
			return false, err
		}
		deleted, err := q.DeploymentDeletedEverywhere(ctx, dbsqlc.DeploymentDeletedEverywhereParams{ID: o.pl.deployment, EffectID: effect})
		if err != nil {
			return false, err
		}
		if deleted {
			if o.pl.desired.Kind == backend.NativeWorker {
				if err := q.WorkerKeptBundlesPrune(ctx, o.pl.desired.ResourceUID); err != nil {
					return false, fmt.Errorf("resource: prune kept bundles: %w", err)
				}
			}
			return true, recordLingering(ctx, q, o)
		}
	}
	operation = uuid.Must(uuid.NewV7())
	code := "compensation_pending"
	if err := q.OperationRecord(ctx, dbsqlc.OperationRecordParams{
		ID: operation, OrganizationID: org, Kind: "compensation", ExternalKey: o.pl.deployment.String(), Method: "DELETE", Status: dbsqlc.OperationStatusCommitted, Code: &code,
	}); err != nil {
		return false, fmt.Errorf("resource: record pending compensation: %w", err)
	}
	if err := q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: uuid.New(), OperationID: operation, DeploymentID: o.pl.deployment, Action: dbsqlc.EffectActionDelete, Status: dbsqlc.EffectStatusFailed}); err != nil {
		return false, err
	}
	_, err = q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: dbsqlc.DeploymentStatusDeleting,
		FromStatuses: texts(dbsqlc.DeploymentStatusPending, dbsqlc.DeploymentStatusActive, dbsqlc.DeploymentStatusDeleting, dbsqlc.DeploymentStatusFailed)})
	return false, err
}

func backendFailed(o outcome) error {
	if err := backend.Problem(o.err, "apply again"); err != nil {
		return err
	}
	if errors.Is(o.err, backend.ErrUnreachable) {
		return apierr.New(apierr.BackendUnreachable, "the backend could not be reached; apply again to retry")
	}
	if o.present && o.obs.Failed {
		// The code cannot run: a bad input, which a retry of the same request would only repeat.
		return apierr.New(apierr.DeploymentFailed, "the backend could not start the new deployment (%s); the previous one, if any, keeps serving; fix the code and apply again", o.obs.Message)
	}
	detail := "the backend could not apply the change; apply again to retry"
	if o.present {
		detail = "the backend did not make the deployment Ready in time; it keeps trying: apply again"
	}
	return apierr.New(apierr.BackendFailed, "%s", detail)
}

func (s *Service) mutator(p Placement) (backend.Mutator, error) {
	inst, ok := s.Catalog.Installations[p.Installation]
	if !ok {
		return nil, apierr.New(apierr.PlacementDrift, "installation %q is no longer in the catalog; the object cannot be observed or changed there", p.Installation)
	}
	mut, err := s.Backends.Mutator(inst)
	if errors.Is(err, backend.ErrNotImplemented) {
		return nil, apierr.New(apierr.NotImplemented, "the %s backend pack cannot run workers yet; only derivation is available", inst.Pack)
	}
	return mut, err
}

// compensate takes down what a create that will not commit left on the backend: one backend
// call per deployment it applied, each read back. It returns the outcomes for the refusal's
// transaction to record; whatever it cannot confirm stays open and the janitor finishes it.
func (s *Service) compensate(ctx context.Context, mut backend.Mutator, work []planned) []outcome {
	var out []outcome
	for _, pl := range work {
		del := pl
		del.action = dbsqlc.EffectActionDelete
		del.desired.EffectID = uuid.New()
		out = append(out, perform(context.WithoutCancel(ctx), mut, del))
	}
	return out
}

// Liveness is a backend's own report on a resource's current deployment, read without a
// transaction: the deployment rows say what the Host admitted; this says whether it serves now.
type Liveness struct {
	// Reachable is false when the backend could not be asked.
	Reachable bool
	Obs       backend.Observation
}

// serves reports whether live (when asked) says deployment serves now.
func (l *Liveness) serves(deployment uuid.UUID) bool {
	return l == nil || (l.Reachable && l.Obs.Holds(deployment) && l.Obs.Ready)
}

// condition is why live keeps a resource from Ready (deployment is the one the Host admitted).
func (l *Liveness) condition(deployment uuid.UUID) (reason, message string) {
	switch {
	case !l.Reachable:
		return "RuntimeUnreachable", "the backend could not be asked how the deployment runs"
	case !l.Obs.Holds(deployment):
		return "RuntimePending", "the backend does not hold the current deployment yet"
	case l.Obs.Reason != "":
		return l.Obs.Reason, l.Obs.Message
	}
	return "RuntimePending", "the backend has not made the current deployment Ready yet"
}

// observe asks a resource's backend how its native object runs now (a backend call, never inside
// a transaction). A pack that cannot be asked reports nothing (nil), and readiness rests on the
// deployment rows alone.
func (s *Service) observe(ctx context.Context, p Placement, kind, native string) *Liveness {
	mut, err := s.mutator(p)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, backend.ObserveTimeout)
	defer cancel()
	return liveness(mut.Observe(ctx, kind, native))
}

// liveness is what one read of a native object says: unreachable where the read failed.
func liveness(obs backend.Observation, err error) *Liveness {
	if err != nil {
		return &Liveness{Reachable: false}
	}
	return &Liveness{Reachable: true, Obs: obs}
}

// awaitServing waits, bounded, until the worker's backend serves deployment (a new delivery
// admits a new incarnation through the update path), and reports what it last saw. An
// unreachable backend is asked again until the wait ends.
func (s *Service) awaitServing(ctx context.Context, p Placement, native string, deployment uuid.UUID, within time.Duration) *Liveness {
	mut, err := s.mutator(p)
	if err != nil {
		return nil
	}
	return liveness(backend.Await(ctx, mut, backend.NativeWorker, native, time.Now().Add(within), func(obs backend.Observation, err error) bool {
		return liveness(obs, err).serves(deployment)
	}))
}

// texts is a compare-and-swap's expected statuses as the query takes them (text[], cast to the
// enum in SQL).
func texts[S ~string](statuses ...S) []string {
	out := make([]string, len(statuses))
	for i, s := range statuses {
		out[i] = string(s)
	}
	return out
}
