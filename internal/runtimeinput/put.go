package runtimeinput

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// Put seals the runtime input operationID, or answers its owner's unchanged request, in the
// mutation's one transaction: a preparation has no backend effect. token is the owner's, shown
// in the projection.
func (s *Service) Put(ctx context.Context, m *ownership.Mutation, org auth.Organization, operationID string, req Request, token string) (ownership.Response, error) {
	in := inputOf(req)
	return ownership.CommitObject(ctx, m,
		func(tx pgx.Tx) (Preparation, error) { return s.prepare(ctx, tx, org, operationID, in) },
		func(tx pgx.Tx) (Preparation, error) { return s.reconcile(ctx, tx, org, operationID, in) },
		func(p Preparation, created bool) ownership.Response {
			return ownership.Answer(created, p.Project(token).JSON(), p.MaterialSetID)
		})
}

// Delete ends the preparation operationID in any state, leaving a tombstone (SPEC 3.5), in the
// mutation's one transaction.
func (s *Service) Delete(ctx context.Context, m *ownership.Mutation, org auth.Organization, operationID string) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		p, err := s.Abort(ctx, tx, org, operationID)
		if err != nil {
			return ownership.Response{}, err
		}
		return ownership.Answer(false, p.Project("").JSON(), p.MaterialSetID), nil
	})
}
