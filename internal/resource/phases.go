package resource

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// effects runs the backend effects of one request on one resource (a worker's or an endpoint's
// put or delete) as its phases, in this order:
//
//  1. plan, inside a transaction of the request's: the deployments and their effects are recorded
//     as dispatched before any backend call (apply; remove also opens the deletion attestation);
//  2. perform, outside any transaction: one backend call per effect, each read back;
//  3. compensate and refuse, when a call is not confirmed or a create will not commit: what the
//     create applied is taken down again, and the refusal's transaction (ownership's OnRefuse)
//     records the outcomes, the compensations and the create abandoned;
//  4. record, in the commit transaction: the outcomes into the ledger (a delete's also closes the
//     attestation).
//
// A Host that stops between perform and record leaves the effects dispatched under a running
// operation; Recover settles them from what the backend holds.
type effects struct {
	s    *Service
	m    *ownership.Mutation
	org  string
	kind dbsqlc.ResourceKind // the deployments' resource kind
	p    Placement
	// mut is the placement's mutator: a put resolves it before planning; a delete when it has
	// something to perform.
	mut backend.Mutator
	uid uuid.UUID
	// removal: the effects are deletes, which never compensate, and whose record closes the
	// resource's deletion attestation.
	removal bool
	// create: the put creates the resource, which never existed if the request does not commit.
	create  bool
	work    []planned
	pending []outcome // performed and confirmed, not recorded yet
	// unconfirmed: the commit found a deployment a pool member did not confirm deleted.
	unconfirmed bool
}

// putEffects is the runner of a put's apply on placement p.
func (s *Service) putEffects(m *ownership.Mutation, org string, kind dbsqlc.ResourceKind, p Placement, mut backend.Mutator) *effects {
	return &effects{s: s, m: m, org: org, kind: kind, p: p, mut: mut}
}

// deleteEffects is the runner of the delete of resource uid on placement p.
func (s *Service) deleteEffects(m *ownership.Mutation, org string, kind dbsqlc.ResourceKind, uid uuid.UUID, p Placement) *effects {
	return &effects{s: s, m: m, org: org, kind: kind, p: p, uid: uid, removal: true}
}

// apply plans, in the put's plan transaction, the deployment of generation of resource uid.
func (r *effects) apply(ctx context.Context, q *dbsqlc.Queries, uid uuid.UUID, generation int64, d backend.Desired) error {
	pl, err := planApply(ctx, q, r.m, r.org, r.kind, uid, generation, r.p, d)
	if err != nil {
		return err
	}
	r.uid, r.create, r.work = uid, r.m.Current == nil, []planned{pl}
	return nil
}

// remove opens the resource's deletion attestation and plans the deletes of its deployments, in
// the transaction that marks it deleting. The attestation closes only when the backend confirmed
// absence (record).
func (r *effects) remove(ctx context.Context, q *dbsqlc.Queries) error {
	if err := q.AttestationOpen(ctx, dbsqlc.AttestationOpenParams{UID: r.uid, OrganizationID: r.org, ResourceKind: r.kind, OperationID: &r.m.Operation}); err != nil {
		return fmt.Errorf("resource: open attestation: %w", err)
	}
	work, err := planDeletes(ctx, q, r.m.Operation, r.kind, r.uid, r.p)
	r.work = work
	return err
}

// plannedDeployment is the deployment the put planned (false when nothing changes).
func (r *effects) plannedDeployment() (uuid.UUID, bool) {
	if len(r.work) == 0 {
		return uuid.Nil, false
	}
	return r.work[0].deployment, true
}

// perform carries out the planned effects (backend calls, no transaction). When the backend does
// not confirm one, a create's apply that it may hold is compensated, the refusal will record it
// all, and the request is refused with refused(that outcome).
func (r *effects) perform(ctx context.Context, refused func(outcome) error) error {
	if len(r.work) == 0 {
		return nil
	}
	if r.mut == nil {
		mut, err := r.s.mutator(r.p)
		if err != nil {
			return err
		}
		r.mut = mut
	}
	outs := make([]outcome, 0, len(r.work))
	failed := -1
	for _, pl := range r.work {
		o := perform(ctx, r.mut, pl)
		if !o.done && failed < 0 {
			failed = len(outs)
		}
		outs = append(outs, o)
	}
	if failed < 0 {
		r.pending = outs
		return nil
	}
	var undone []outcome
	if o := outs[failed]; r.create && o.pl.action == dbsqlc.EffectActionApply && o.mayHold() {
		// A create that will not commit never existed: take down what it may have put there (a
		// script still starting would otherwise run on for ever).
		undone = r.s.compensate(ctx, r.mut, []planned{o.pl})
	}
	r.refuse(outs, undone)
	return refused(outs[failed])
}

// recordNow records the performed effects in a transaction of their own, for a later phase that
// reads them (a runtime input binds only to an active deployment).
func (r *effects) recordNow(ctx context.Context) error {
	if len(r.pending) == 0 {
		return nil
	}
	if err := r.m.Tx(ctx, func(tx pgx.Tx) error { return r.recordOutcomes(ctx, dbsqlc.New(tx)) }); err != nil {
		return err
	}
	r.pending = nil
	return nil
}

// record is the commit transaction's part: the performed effects into the ledger, and, for a
// delete, the deletion attestation closed, only after absence was read back.
func (r *effects) record(ctx context.Context, q *dbsqlc.Queries) error {
	if err := r.recordOutcomes(ctx, q); err != nil {
		return err
	}
	if !r.removal {
		return nil
	}
	if err := r.deletedEverywhere(ctx, q); err != nil {
		return err
	}
	if err := q.AttestationClose(ctx, r.uid); err != nil {
		return fmt.Errorf("resource: close attestation: %w", err)
	}
	return nil
}

// deletedEverywhere refuses the close of a deletion whose deployments are not all deleted: on a
// pool, a member that may route did not confirm the absence (it was added while the delete ran,
// or the pack's read of the pool missed it). The request answers 503, which the provider retries,
// and the retry asks that member too.
func (r *effects) deletedEverywhere(ctx context.Context, q *dbsqlc.Queries) error {
	open, err := q.DeploymentsOpen(ctx, r.uid)
	if err != nil || len(open) == 0 {
		return err
	}
	nodes, err := q.ResourceMembersUnconfirmed(ctx, dbsqlc.ResourceMembersUnconfirmedParams{ResourceUID: r.uid, OperationID: r.m.Operation})
	if err != nil {
		return err
	}
	r.unconfirmed = true
	who := "a node"
	if len(nodes) > 0 {
		who = "node " + strings.Join(nodes, ", node ")
	}
	return apierr.New(apierr.BackendUnreachable, "%s of the pool was not asked to confirm the deletion (this Host's read of the pool did not have it: it was added meanwhile, or the read was a few seconds old); delete again to retry (the deletion attestation stays open until every node confirms)", who)
}

func (r *effects) recordOutcomes(ctx context.Context, q *dbsqlc.Queries) error {
	for _, o := range r.pending {
		if err := record(ctx, q, o, r.uid); err != nil {
			return err
		}
	}
	return nil
}

// commit is the request's commit transaction: the record, then the resource's own part (fn). When
// that transaction refuses (record or fn fails, or PostgreSQL answered its COMMIT with an error,
// a deadlock among its deferred writes for one: nothing of it committed), a create that landed
// on the backend is taken down again (undo): it will never exist. A COMMIT that got no answer is
// ambiguous, the create may stand, so it is left alone; recovery settles the operation.
func (r *effects) commit(ctx context.Context, fn func(tx pgx.Tx) (ownership.Response, error)) (ownership.Response, error) {
	refused := false
	resp, err := r.m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		refused = false
		if err := r.record(ctx, dbsqlc.New(tx)); err != nil {
			refused = true
			return ownership.Response{}, err
		}
		resp, err := fn(tx)
		refused = err != nil
		return resp, err
	})
	var answered *pgconn.PgError
	if err != nil && (refused || errors.As(err, &answered)) {
		r.undo(ctx)
	}
	if err != nil && r.unconfirmed {
		r.refuse(r.pending, nil) // the refusal records the outcomes: the deployments stay deleting
	}
	return resp, err
}

// undo takes down a create that landed on the backend but will not commit (a later phase refused
// it): one backend delete per deployment, recorded with what is still pending by the refusal.
func (r *effects) undo(ctx context.Context) {
	if !r.create || len(r.work) == 0 {
		return
	}
	r.refuse(r.pending, r.s.compensate(ctx, r.mut, r.work))
}

// refuse registers what the refusal's transaction records: the outcomes, the compensations, and a
// create abandoned (a create that never committed leaves the uniqueness constraints).
func (r *effects) refuse(outs, undone []outcome) {
	org, op, kind, uid, create, installation := r.org, r.m.Operation, r.kind, r.uid, r.create, r.p.Installation
	r.m.OnRefuse(func(ctx context.Context, tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		for _, o := range outs {
			if err := record(ctx, q, o, uid); err != nil {
				return err
			}
			// An upload that got no answer may land after this refusal (late_writes.go).
			if err := r.s.openRecheck(ctx, q, org, installation, o); err != nil {
				return err
			}
		}
		for _, o := range undone {
			if _, err := recordCompensation(ctx, q, org, op, o); err != nil {
				return err
			}
		}
		if !create {
			return nil
		}
		var err error
		if kind == dbsqlc.ResourceKindWorker {
			_, err = q.ResourceAbandonCreate(ctx, uid)
		} else {
			_, err = q.EndpointAbandonCreate(ctx, uid)
		}
		return err
	})
}

// deleteUnconfirmed is a delete's refusal when the backend did not confirm absence.
func deleteUnconfirmed(o outcome) error {
	if err := backend.Problem(o.err, "apply again"); err != nil {
		return err
	}
	code := apierr.BackendFailed
	if errors.Is(o.err, backend.ErrUnreachable) {
		code = apierr.BackendUnreachable
	}
	return apierr.New(code, "the backend could not confirm the deletion; delete again to retry (the deletion attestation stays open until it does)")
}
