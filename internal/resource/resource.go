// Package resource is the authority over workers and endpoints (SPEC 3.6): their rows, their
// backend deployments, deletion attestations, and readiness derived from the deployment rows on
// every read. Every mutation runs inside an ownership.Mutation as a few named phases, each one
// transaction or one backend call, never both, and records its backend effects in the operation
// ledger (planned -> dispatched -> succeeded | failed).
package resource

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Ownership kinds and provider resource types.
const (
	WorkerKind           = "worker"
	WorkerResourceType   = "takoform_worker"
	EndpointKind         = "worker-endpoint"
	EndpointResourceType = "takoform_worker_endpoint"
)

// BackendCallTimeout bounds one backend call, admission wait included, inside an ownership lease
// (renewed while the call runs), so that a call cannot outlive the request that made it.
const BackendCallTimeout = 45 * time.Second

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Placement is where a resource runs (see catalog.Placement).
type Placement = catalog.Placement

// Service changes workers and endpoints.
type Service struct {
	Catalog       *catalog.Catalog
	Backends      *backend.Registry
	Reservations  *reservation.Service
	RuntimeInputs *runtimeinput.Service
	// Hooks stop a runtime-input consumption at a precise point (tests only).
	Hooks runtimeinput.Hooks
}

// Condition is one entry of a resource's conditions.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// CheckBrake refuses a graph-changing mutation while a deployment brake covers the organization
// or the worker (SPEC 3.6). worker is the worker name the mutation changes, or empty.
func CheckBrake(ctx context.Context, db dbsqlc.DBTX, org, space, worker string) error {
	params := dbsqlc.BrakeEngagedParams{OrganizationID: &org}
	if worker != "" {
		params.Space, params.WorkerName = &space, &worker
	}
	engaged, err := dbsqlc.New(db).BrakeEngaged(ctx, params)
	if err != nil {
		return fmt.Errorf("resource: read brakes: %w", err)
	}
	if engaged {
		return apierr.New(apierr.DeploymentBrake, "a deployment brake covers this change: graph-changing mutations are refused until an operator releases it (reads continue)")
	}
	return nil
}

// planned is a deployment and its effect, recorded as dispatched in the transaction that planned
// it, and carried out by one backend call after that transaction commits.
type planned struct {
	deployment uuid.UUID
	effect     uuid.UUID
	action     string
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
	obs     backend.Observation
	err     error
}

// mayHold reports whether the backend may hold what the outcome's apply wrote.
func (o outcome) mayHold() bool { return o.present || o.unknown }

func planApply(ctx context.Context, q *dbsqlc.Queries, m *ownership.Mutation, org, kind string, uid uuid.UUID, generation int64, p Placement, d backend.Desired) (planned, error) {
	pl := planned{deployment: uuid.New(), effect: uuid.New(), action: "apply", desired: d, placement: p}
	var routeScript *string
	if kind == "endpoint" {
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
	if err := q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: pl.effect, OperationID: m.Operation, DeploymentID: pl.deployment, Action: "apply", Status: "dispatched"}); err != nil {
		return planned{}, fmt.Errorf("resource: plan effect: %w", err)
	}
	return pl, nil
}

// deployed rebuilds what a recorded deployment wrote, for its delete or its read-back.
func deployed(kind string, deployment, resource uuid.UUID, native string, seq int64, routeScript *string) backend.Desired {
	d := backend.Desired{Kind: kind, NativeName: native, DeploymentID: deployment, ResourceUID: resource, Sequence: seq}
	if routeScript != nil {
		d.ScriptName = *routeScript
	}
	return d
}

// planDeletes moves every open deployment of uid to deleting and plans one delete effect each.
func planDeletes(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID, kind string, uid uuid.UUID, p Placement) ([]planned, error) {
	open, err := q.DeploymentsOpen(ctx, uid)
	if err != nil {
		return nil, fmt.Errorf("resource: open deployments: %w", err)
	}
	var out []planned
	for _, d := range open {
		pl := planned{deployment: d.ID, effect: uuid.New(), action: "delete", placement: p,
			desired: deployed(kind, d.ID, uid, d.NativeName, d.Seq, d.RouteScript)}
		pl.desired.EffectID = pl.effect
		if _, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: d.ID, Status: "deleting", FromStatuses: []string{"pending", "active", "deleting"}}); err != nil {
			return nil, fmt.Errorf("resource: mark deployment deleting: %w", err)
		}
		if err := q.EffectInsert(ctx, dbsqlc.EffectInsertParams{ID: pl.effect, OperationID: operation, DeploymentID: d.ID, Action: "delete", Status: "dispatched"}); err != nil {
			return nil, fmt.Errorf("resource: plan effect: %w", err)
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
	if pl.action == "apply" {
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
		o := outcome{pl: pl, present: holds, unknown: unknown, done: holds && obs.Admitted, obs: obs, err: err}
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
	status := "failed"
	if o.done {
		status = "succeeded"
	}
	if _, err := q.EffectSetStatus(ctx, dbsqlc.EffectSetStatusParams{ID: o.pl.effect, Status: status, Detail: detail, FromStatuses: []string{"planned", "dispatched"}}); err != nil {
		return fmt.Errorf("resource: settle effect: %w", err)
	}
	switch {
	case o.pl.action == "apply" && o.done:
		if _, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: "active", FromStatuses: []string{"pending"}}); err != nil {
			return fmt.Errorf("resource: activate deployment: %w", err)
		}
		return q.DeploymentSupersede(ctx, dbsqlc.DeploymentSupersedeParams{ResourceUID: resourceUID, ID: o.pl.deployment})
	case o.pl.action == "apply":
		_, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: "failed", FromStatuses: []string{"pending"}})
		return err
	case o.done:
		if _, err := q.DeploymentSetStatus(ctx, dbsqlc.DeploymentSetStatusParams{ID: o.pl.deployment, Status: "deleted", FromStatuses: []string{"deleting", "active", "pending"}}); err != nil {
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

// beginDelete opens the deletion attestation of uid and plans the deletes of its deployments, in
// the transaction that marks the resource deleting.
func beginDelete(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID, org, kind string, uid uuid.UUID, p Placement) ([]planned, error) {
	// The attestation closes only when the backend confirmed absence (finishDelete).
	if err := q.AttestationOpen(ctx, dbsqlc.AttestationOpenParams{UID: uid, OrganizationID: org, ResourceKind: kind, OperationID: &operation}); err != nil {
		return nil, fmt.Errorf("resource: open attestation: %w", err)
	}
	native := backend.NativeWorker
	if kind == "endpoint" {
		native = backend.NativeRoute
	}
	return planDeletes(ctx, q, operation, native, uid, p)
}

// finishDelete records the deletes the backend confirmed (performDeletes refused the request
// otherwise) and closes the resource's deletion attestation, in the commit transaction: the
// attestation closes only after absence was read back.
func finishDelete(ctx context.Context, q *dbsqlc.Queries, outs []outcome, uid uuid.UUID) error {
	for _, o := range outs {
		if err := record(ctx, q, o, uid); err != nil {
			return err
		}
	}
	if err := q.AttestationClose(ctx, uid); err != nil {
		return fmt.Errorf("resource: close attestation: %w", err)
	}
	return nil
}

// performDeletes carries out planned deletes (backend calls, no transaction). Any that the
// backend does not confirm refuses the request, with the outcomes recorded by the refusal.
func (s *Service) performDeletes(ctx context.Context, m *ownership.Mutation, p Placement, work []planned, uid uuid.UUID) ([]outcome, error) {
	if len(work) == 0 {
		return nil, nil
	}
	mut, err := s.mutator(p)
	if err != nil {
		return nil, err
	}
	var outs []outcome
	var unconfirmed *outcome
	for _, pl := range work {
		o := perform(ctx, mut, pl)
		outs = append(outs, o)
		if !o.done && unconfirmed == nil {
			unconfirmed = &o
		}
	}
	if unconfirmed != nil {
		m.OnRefuse(func(ctx context.Context, tx pgx.Tx) error {
			q := dbsqlc.New(tx)
			for _, o := range outs {
				if err := record(ctx, q, o, uid); err != nil {
					return err
				}
			}
			return nil
		})
		if err := backend.Problem(unconfirmed.err, "apply again"); err != nil {
			return nil, err
		}
		code := apierr.BackendFailed
		if errors.Is(unconfirmed.err, backend.ErrUnreachable) {
			code = apierr.BackendUnreachable
		}
		return nil, apierr.New(code, "the backend could not confirm the deletion; delete again to retry (the deletion attestation stays open until it does)")
	}
	return outs, nil
}

// compensate takes down what a create that will not commit left on the backend: one backend
// call per deployment it applied, each read back. It returns the outcomes for the refusal's
// transaction to record; whatever it cannot confirm stays open and the janitor finishes it.
func (s *Service) compensate(ctx context.Context, mut backend.Mutator, work []planned) []outcome {
	var out []outcome
	for _, pl := range work {
		del := pl
		del.action = "delete"
		del.desired.EffectID = uuid.New()
		out = append(out, perform(context.WithoutCancel(ctx), mut, del))
	}
	return out
}

// txFunc is a phase transaction.
type txFunc = func(ctx context.Context, fn func(pgx.Tx) error) error
