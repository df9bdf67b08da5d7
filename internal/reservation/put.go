package reservation

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// Put creates reservation id, or answers its owner's unchanged request (after the If-Match
// revision check), in the mutation's one transaction: a reservation has no backend effect. token
// is the owner's, shown in the projection.
func (s *Service) Put(ctx context.Context, m *ownership.Mutation, org auth.Organization, id string, req Request, token string) (ownership.Response, error) {
	return ownership.CommitObject(ctx, m,
		func(tx pgx.Tx) (Reservation, error) { return s.Create(ctx, tx, org, id, req) },
		func(tx pgx.Tx) (Reservation, error) {
			r, err := s.Reconcile(ctx, tx, org, id, req)
			if err == nil {
				err = m.CheckRevision(r.Revision)
			}
			return r, err
		},
		func(r Reservation, created bool) ownership.Response {
			return ownership.Answer(created, r.Project(token).JSON(), r.UID)
		})
}

// Delete releases reservation id under the four fences, in the mutation's one transaction,
// unless a deployment brake covers its worker.
func (s *Service) Delete(ctx context.Context, m *ownership.Mutation, org auth.Organization, id string) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		r, _, err := s.Get(ctx, tx, org, id)
		if err == nil {
			err = ownership.CheckBrake(ctx, tx, org.ID, r.Space, r.WorkerName)
		}
		if err == nil {
			r, err = s.Release(ctx, tx, org, id, m.Current.UID)
		}
		if err != nil {
			return ownership.Response{}, err
		}
		return ownership.Answer(false, r.Project("").JSON(), r.UID), nil
	})
}
