package resource

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// Recover settles an operation whose Host stopped mid-request. It reads every unsettled effect
// back from the backend and records what is actually there, then marks the operation refused
// ("abandoned"), all in one transaction so that no fence ever sees the operation settled before
// its effects are. It never calls a mutating backend method: an apply that landed is recorded as
// active, one that did not as failed; a delete that finished as deleted, one that did not leaves
// the deployment standing for the owner's retry to take down.
func (s *Service) Recover(ctx context.Context, begin func(context.Context) (pgx.Tx, error), op uuid.UUID) error {
	tx, err := begin(ctx)
	if err != nil {
		return fmt.Errorf("recover: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	type unsettled struct {
		effect, deployment               uuid.UUID
		action, status, deploymentStatus string
		kind, native, installation       string
		resource                         uuid.UUID
	}
	rows, err := tx.Query(ctx, store.Q("OperationUnsettledEffects"), pgx.NamedArgs{"operation_id": op})
	if err != nil {
		return fmt.Errorf("recover: effects: %w", err)
	}
	var work []unsettled
	var u unsettled
	if _, err := pgx.ForEachRow(rows, []any{&u.effect, &u.action, &u.status, &u.deployment, &u.deploymentStatus, &u.kind, &u.resource, &u.native, &u.installation}, func() error {
		work = append(work, u)
		return nil
	}); err != nil {
		return fmt.Errorf("recover: effects: %w", err)
	}
	for _, u := range work {
		mut, err := s.mutator(Placement{Installation: u.installation})
		if err != nil {
			return err
		}
		obs, err := mut.Observe(ctx, u.kind, u.native)
		if err != nil {
			return fmt.Errorf("recover: read back %s %s: %w", u.kind, u.native, err)
		}
		landed := obs.Present && obs.DeploymentID == u.deployment
		effect, deployment := "failed", ""
		switch {
		case u.action == "apply" && landed:
			effect, deployment = "succeeded", "active"
		case u.action == "apply":
			deployment = "failed"
		case u.action == "delete" && !obs.Present:
			effect, deployment = "succeeded", "deleted"
		default: // a delete that did not finish: the object stands
			deployment = "active"
		}
		if _, err := tx.Exec(ctx, store.Q("RecoverySettleEffect"), pgx.NamedArgs{"id": u.effect, "status": effect}); err != nil {
			return fmt.Errorf("recover: effect: %w", err)
		}
		if _, err := tx.Exec(ctx, store.Q("RecoverySettleDeployment"), pgx.NamedArgs{"id": u.deployment, "status": deployment}); err != nil {
			return fmt.Errorf("recover: deployment: %w", err)
		}
		if deployment == "active" {
			if _, err := tx.Exec(ctx, store.Q("DeploymentSupersede"), pgx.NamedArgs{"resource_uid": u.resource, "id": u.deployment}); err != nil {
				return fmt.Errorf("recover: supersede: %w", err)
			}
		}
	}
	if s.RuntimeInputs != nil {
		if err := s.RuntimeInputs.RecoverLeases(ctx, tx, s.Catalog.Installations, op); err != nil {
			return fmt.Errorf("recover: runtime inputs: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, store.Q("OperationAbandon"), pgx.NamedArgs{"id": op}); err != nil {
		return fmt.Errorf("recover: abandon: %w", err)
	}
	return tx.Commit(ctx)
}
