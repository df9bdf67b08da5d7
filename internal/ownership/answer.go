package ownership

import (
	"context"
	"fmt"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Answer is a committed mutation's answer: its projection's body and its object's UID, for an
// object the request made (created) or one it changed, found unchanged or deleted. The domain
// says which; the status it is recorded under is the ledger's (201 or 200), and a replay answers
// it again.
func Answer(created bool, body []byte, uid uuid.UUID) Response {
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return Response{Status: status, Body: body, UID: uid}
}

// CommitObject is the whole effect of a mutation whose object lives in one transaction (it has
// no backend effect): create it when nothing is bound to the key, else reconcile the request with
// what is held, and commit the answer with the binding.
func CommitObject[T any](ctx context.Context, m *Mutation, create, reconcile func(pgx.Tx) (T, error), answer func(obj T, created bool) Response) (Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (Response, error) {
		created := m.Current == nil
		var obj T
		var err error
		if created {
			obj, err = create(tx)
		} else {
			obj, err = reconcile(tx)
		}
		if err != nil {
			return Response{}, err
		}
		return answer(obj, created), nil
	})
}

// errBraked is the refusal of a graph-changing mutation that a deployment brake covers.
func errBraked() error {
	return apierr.New(apierr.DeploymentBrake, "a deployment brake covers this change: graph-changing mutations are refused until an operator releases it (reads continue)")
}

// CheckBrake refuses a graph-changing mutation while a deployment brake covers the organization
// or the worker (SPEC 3.6): worker is the worker name the mutation changes, or empty. The lock
// step checks the brake of an intent's BrakeScope; this is for a mutation whose worker is known
// only once its object is read (a delete).
func CheckBrake(ctx context.Context, db dbsqlc.DBTX, org, space, worker string) error {
	params := dbsqlc.BrakeEngagedParams{OrganizationID: &org}
	if worker != "" {
		params.Space, params.WorkerName = &space, &worker
	}
	engaged, err := dbsqlc.New(db).BrakeEngaged(ctx, params)
	if err != nil {
		return fmt.Errorf("ownership: read brakes: %w", err)
	}
	if engaged {
		return errBraked()
	}
	return nil
}
