package resource

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Recover settles an operation whose Host stopped mid-request (ownership.Manager.Recover). Its
// phases: read what the operation left unsettled (one transaction); read the backend back and take
// down what a create that never committed put there (backend calls, no transaction); record all
// of it and end the operation refused (one transaction, so that no fence ever sees the operation
// settled before its effects are). It never reapplies anything and never delivers a value.
func (s *Service) Recover(ctx context.Context, r *ownership.Recovery) error {
	var effects []dbsqlc.OperationUnsettledEffectsRow
	var creating []dbsqlc.ResourcesCreatingByOperationRow
	if err := r.Tx(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		var err error
		if effects, err = q.OperationUnsettledEffects(ctx, r.Operation); err != nil {
			return err
		}
		creating, err = q.ResourcesCreatingByOperation(ctx, r.Operation)
		return err
	}); err != nil {
		return fmt.Errorf("recover: read the ledger: %w", err)
	}
	abandoned := map[uuid.UUID]bool{}
	for _, c := range creating {
		abandoned[c.UID] = true
	}

	var outs, undone []outcome
	installations := map[uuid.UUID]string{}
	var unobservable []uuid.UUID
	for _, e := range effects {
		mut, err := s.mutator(Placement{Installation: e.Installation})
		if apierr.Is(err, apierr.PlacementDrift) {
			unobservable = append(unobservable, e.EffectID)
			continue // its installation left the catalog: recorded, not retried for ever
		}
		if err != nil {
			return err
		}
		pl := planned{deployment: e.DeploymentID, effect: e.EffectID, action: e.Action,
			desired: deployed(e.ResourceKind, e.DeploymentID, e.ResourceUID, e.NativeName, e.Seq, e.RouteScript)}
		o, err := observe(ctx, mut, pl)
		if err != nil {
			return fmt.Errorf("recover: read back %s %s: %w", e.ResourceKind, e.NativeName, err)
		}
		outs = append(outs, o)
		installations[e.EffectID] = e.Installation
		if abandoned[e.ResourceUID] && o.pl.action == dbsqlc.EffectActionApply && o.mayHold() {
			// A create that never committed never existed: take what it applied down again.
			undone = append(undone, s.compensate(ctx, mut, []planned{pl})...)
		}
	}
	var leases []runtimeinput.Recovered
	if s.RuntimeInputs != nil {
		var err error
		if leases, err = s.RuntimeInputs.ObserveLeases(ctx, r, s.Catalog.Installations, r.Operation); err != nil {
			return err
		}
	}
	return r.Finish(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		for _, o := range outs {
			if err := record(ctx, q, o, o.pl.desired.ResourceUID); err != nil {
				return err
			}
			// Absence read once is not final where a late upload can still land: the janitor
			// reads the script again once the stopped Host's call could have ended.
			if err := s.openRecheck(ctx, q, r.OrganizationID, installations[o.pl.effect], o); err != nil {
				return err
			}
		}
		for _, o := range undone {
			if _, err := recordCompensation(ctx, q, r.OrganizationID, r.Operation, o); err != nil {
				return err
			}
		}
		detail := "its installation left the catalog; the object cannot be observed"
		for _, id := range unobservable {
			if _, err := q.EffectSetStatus(ctx, dbsqlc.EffectSetStatusParams{ID: id, Status: dbsqlc.EffectStatusUnobservable, Detail: &detail,
				FromStatuses: texts(dbsqlc.EffectStatusPlanned, dbsqlc.EffectStatusDispatched)}); err != nil {
				return err
			}
			if err := q.EffectMembersUnsettled(ctx, dbsqlc.EffectMembersUnsettledParams{ParentID: id, Status: dbsqlc.EffectStatusUnobservable, Detail: &detail}); err != nil {
				return err
			}
		}
		for _, c := range creating {
			if c.Kind == dbsqlc.ResourceKindWorker {
				if _, err := q.ResourceAbandonCreate(ctx, c.UID); err != nil {
					return err
				}
			} else if _, err := q.EndpointAbandonCreate(ctx, c.UID); err != nil {
				return err
			}
		}
		return runtimeinput.RecordLeases(ctx, tx, leases)
	})
}

// observe reads one planned effect's native object back, without changing anything.
func observe(ctx context.Context, mut backend.Mutator, pl planned) (outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	defer cancel()
	obs, err := mut.Observe(ctx, pl.desired.Kind, pl.desired.NativeName)
	if err != nil {
		return outcome{}, err
	}
	holds := obs.Holds(pl.deployment)
	// The interrupted call's answer was never recorded: an apply not read back may still land.
	o := outcome{pl: pl, done: holds && obs.Admitted, present: holds, obs: obs, late: pl.action == dbsqlc.EffectActionApply && !holds}
	if pl.action == dbsqlc.EffectActionDelete {
		o.done = !holds
	}
	if !o.done {
		o.err = errors.New("settled by recovery: the interrupted call did not take effect")
	}
	return o, nil
}

// CollectOrphans takes down what creates that never committed left open on a backend (their
// compensation could not be confirmed), for the janitor: one delete per deployment, each read
// back and recorded under an operation of the janitor's own. It reports how many it closed.
func (s *Service) CollectOrphans(ctx context.Context, db interface {
	store.Beginner
	dbsqlc.DBTX
}) (int, error) {
	rows, err := dbsqlc.New(db).DeploymentsOrphaned(ctx)
	if err != nil {
		return 0, fmt.Errorf("resource: orphaned deployments: %w", store.Classify(err))
	}
	closed := 0
	for _, d := range rows {
		mut, err := s.mutator(Placement{Installation: d.Installation})
		if err != nil {
			continue
		}
		pl := planned{deployment: d.ID, action: dbsqlc.EffectActionDelete,
			desired: deployed(d.ResourceKind, d.ID, d.ResourceUID, d.NativeName, d.Seq, d.RouteScript)}
		pl.desired.EffectID = uuid.New()
		o := perform(ctx, mut, pl)
		op := uuid.Must(uuid.NewV7())
		deleted := false
		err = store.WithTx(ctx, db, func(tx pgx.Tx) error {
			q := dbsqlc.New(tx)
			code := "orphan_collected"
			if err := q.OperationRecord(ctx, dbsqlc.OperationRecordParams{
				ID: op, OrganizationID: d.OrganizationID, Kind: "janitor", ExternalKey: d.ID.String(), Method: "DELETE", Status: dbsqlc.OperationStatusCommitted, Code: &code,
			}); err != nil {
				return err
			}
			var err error
			deleted, err = recordCompensation(ctx, q, d.OrganizationID, op, o)
			return err
		})
		if err == nil && deleted {
			closed++
		}
	}
	return closed, nil
}
