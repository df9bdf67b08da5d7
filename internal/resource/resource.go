// Package resource is the authority over workers and endpoints (SPEC 3.6): their rows, their
// backend deployments, deletion attestations, and readiness derived from the deployment rows on
// every read. Every mutation runs inside an ownership.Mutation and records its backend effects in
// the operation ledger (planned -> dispatched -> succeeded | failed).
package resource

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// Ownership kinds and provider resource types.
const (
	WorkerKind           = "worker"
	WorkerResourceType   = "takoform_worker"
	EndpointKind         = "worker-endpoint"
	EndpointResourceType = "takoform_worker_endpoint"
)

var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// Placement is where a resource runs (see catalog.Placement).
type Placement = catalog.Placement

func placementOf(o catalog.Offering) Placement { return o.Placement() }

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

func readyCondition(status, deploymentStatus string) []Condition {
	c := Condition{Type: "Ready", Status: "False"}
	switch {
	case status == "deleted":
		c.Reason, c.Message = "Deleted", "the resource was deleted"
	case status == "deleting":
		c.Reason, c.Message = "Deleting", "the resource is being deleted"
	case deploymentStatus == "active" && status == "live":
		c.Status, c.Reason, c.Message = "True", "DeploymentActive", "the current generation's deployment is active"
	case deploymentStatus == "failed":
		c.Reason, c.Message = "DeploymentFailed", "the backend refused the current generation; apply again to retry"
	default:
		c.Reason, c.Message = "DeploymentPending", "the current generation has no active deployment yet"
	}
	return []Condition{c}
}

// CheckBrake refuses a graph-changing mutation while the deployment brake is engaged.
func CheckBrake(ctx context.Context, tx pgx.Tx) error { return brake(ctx, tx) }

func brake(ctx context.Context, tx pgx.Tx) error {
	var engaged bool
	if err := tx.QueryRow(ctx, store.Q("BrakeEngaged"), pgx.NamedArgs{"name": "deployment"}).Scan(&engaged); err != nil {
		return fmt.Errorf("resource: read brake: %w", err)
	}
	if engaged {
		return apierr.New(apierr.DeploymentBrake, "the deployment brake is engaged: graph-changing mutations are refused until an operator releases it (reads continue)")
	}
	return nil
}

// planned is a deployment and its effect, recorded and not yet dispatched.
type planned struct {
	deployment uuid.UUID
	effect     uuid.UUID
	action     string
	desired    backend.Desired
}

func plan(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org, kind string, uid uuid.UUID, generation int64, p Placement, d backend.Desired) (planned, error) {
	pl := planned{deployment: uuid.New(), effect: uuid.New(), action: "apply", desired: d}
	pl.desired.DeploymentID = pl.deployment
	pl.desired.Generation = generation
	if _, err := tx.Exec(ctx, store.Q("DeploymentInsert"), pgx.NamedArgs{
		"id": pl.deployment, "organization_id": org, "resource_kind": kind, "resource_uid": uid, "generation": generation,
		"native_name": d.NativeName, "offering_id": p.OfferingID, "offering_digest": p.OfferingDigest, "pack": p.Pack, "installation": p.Installation,
	}); err != nil {
		return planned{}, fmt.Errorf("resource: plan deployment: %w", err)
	}
	if _, err := tx.Exec(ctx, store.Q("EffectInsert"), pgx.NamedArgs{
		"id": pl.effect, "operation_id": m.Operation, "deployment_id": pl.deployment, "action": "apply",
	}); err != nil {
		return planned{}, fmt.Errorf("resource: plan effect: %w", err)
	}
	return pl, nil
}

// planDeletes moves every open deployment of uid to deleting and plans one delete effect each.
func planDeletes(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, kind string, uid uuid.UUID) ([]planned, error) {
	rows, err := tx.Query(ctx, store.Q("DeploymentsOpen"), pgx.NamedArgs{"resource_uid": uid})
	if err != nil {
		return nil, fmt.Errorf("resource: open deployments: %w", err)
	}
	var out []planned
	var id uuid.UUID
	var native string
	if _, err := pgx.ForEachRow(rows, []any{&id, &native}, func() error {
		out = append(out, planned{deployment: id, effect: uuid.New(), action: "delete", desired: backend.Desired{Kind: kind, NativeName: native, DeploymentID: id}})
		return nil
	}); err != nil {
		return nil, fmt.Errorf("resource: open deployments: %w", err)
	}
	for _, pl := range out {
		if _, err := tx.Exec(ctx, store.Q("DeploymentSetStatus"), pgx.NamedArgs{"id": pl.deployment, "status": "deleting", "from": []string{"pending", "active", "deleting"}}); err != nil {
			return nil, fmt.Errorf("resource: mark deployment deleting: %w", err)
		}
		if _, err := tx.Exec(ctx, store.Q("EffectInsert"), pgx.NamedArgs{
			"id": pl.effect, "operation_id": m.Operation, "deployment_id": pl.deployment, "action": "delete",
		}); err != nil {
			return nil, fmt.Errorf("resource: plan effect: %w", err)
		}
	}
	return out, nil
}

// dispatch carries out one planned effect: it records the dispatch before calling the backend,
// and the outcome after, each in its own transaction, so a crash leaves a ledger that says how far
// the effect got.
func (s *Service) dispatch(ctx context.Context, m *ownership.Mutation, mut backend.Mutator, pl planned) error {
	if err := m.Tx(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, store.Q("EffectSetStatus"), pgx.NamedArgs{"id": pl.effect, "status": "dispatched", "from": "planned", "detail": nil})
		return err
	}); err != nil {
		return fmt.Errorf("resource: dispatch effect: %w", err)
	}
	var callErr error
	if pl.action == "apply" {
		callErr = mut.Apply(ctx, pl.desired)
	} else {
		callErr = mut.Delete(ctx, pl.desired.Kind, pl.desired.NativeName)
		if callErr == nil {
			// Absence is confirmed by reading back, not assumed from the call.
			obs, err := mut.Observe(ctx, pl.desired.Kind, pl.desired.NativeName)
			if err == nil && obs.Present && obs.DeploymentID == pl.deployment {
				err = errors.New("the native object is still present after delete")
			}
			callErr = err
		}
	}
	ctx = context.WithoutCancel(ctx)
	if callErr != nil {
		_ = m.Tx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, store.Q("EffectSetStatus"), pgx.NamedArgs{"id": pl.effect, "status": "failed", "from": "dispatched", "detail": callErr.Error()}); err != nil {
				return err
			}
			if pl.action == "apply" {
				_, err := tx.Exec(ctx, store.Q("DeploymentSetStatus"), pgx.NamedArgs{"id": pl.deployment, "status": "failed", "from": []string{"pending"}})
				return err
			}
			return nil
		})
		return &apierr.Error{Code: apierr.BackendFailed, Detail: "the backend could not apply the change; apply again to retry"}
	}
	return m.Tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, store.Q("EffectSetStatus"), pgx.NamedArgs{"id": pl.effect, "status": "succeeded", "from": "dispatched", "detail": nil}); err != nil {
			return fmt.Errorf("resource: settle effect: %w", err)
		}
		if pl.action == "apply" {
			if _, err := tx.Exec(ctx, store.Q("DeploymentSetStatus"), pgx.NamedArgs{"id": pl.deployment, "status": "active", "from": []string{"pending"}}); err != nil {
				return fmt.Errorf("resource: activate deployment: %w", err)
			}
			_, err := tx.Exec(ctx, store.Q("DeploymentSupersede"), pgx.NamedArgs{"resource_uid": pl.desired.ResourceUID, "id": pl.deployment})
			return err
		}
		_, err := tx.Exec(ctx, store.Q("DeploymentSetStatus"), pgx.NamedArgs{"id": pl.deployment, "status": "deleted", "from": []string{"deleting"}})
		return err
	})
}

func (s *Service) mutator(p Placement) (backend.Mutator, error) {
	inst, ok := s.Catalog.Installations[p.Installation]
	if !ok {
		return nil, apierr.New(apierr.PlacementDrift, "installation %q is no longer in the catalog", p.Installation)
	}
	mut, err := s.Backends.Mutator(inst)
	if errors.Is(err, backend.ErrNotImplemented) {
		return nil, apierr.New(apierr.NotImplemented, "the %s backend pack cannot run workers yet; only derivation is available", inst.Pack)
	}
	return mut, err
}

// beginDelete opens the deletion attestation of uid and plans the deletes of its deployments, in
// the transaction that marks the resource deleting.
func beginDelete(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org, kind string, uid uuid.UUID) ([]planned, error) {
	if _, err := tx.Exec(ctx, store.Q("AttestationOpen"), pgx.NamedArgs{"uid": uid, "organization_id": org, "resource_kind": kind, "operation_id": m.Operation}); err != nil {
		return nil, fmt.Errorf("resource: open attestation: %w", err)
	}
	native := backend.NativeWorker
	if kind == "endpoint" {
		native = backend.NativeRoute
	}
	return planDeletes(ctx, tx, m, native, uid)
}

// finishDelete dispatches the planned deletes, then, once the backend confirmed absence, closes
// the attestation and lets finalize mark the resource deleted, in one transaction.
func (s *Service) finishDelete(ctx context.Context, m *ownership.Mutation, p Placement, work []planned, uid uuid.UUID, finalize func(pgx.Tx) error) error {
	mut, err := s.mutator(p)
	if err != nil {
		return err
	}
	for _, pl := range work {
		if err := s.dispatch(ctx, m, mut, pl); err != nil {
			return err
		}
	}
	return m.Tx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, store.Q("AttestationClose"), pgx.NamedArgs{"uid": uid}); err != nil {
			return fmt.Errorf("resource: close attestation: %w", err)
		}
		return finalize(tx)
	})
}
