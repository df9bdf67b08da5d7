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
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		var r Reservation
		var err error
		created := m.Current == nil
		if created {
			r, err = s.Create(ctx, tx, org, id, req)
		} else if r, err = s.Reconcile(ctx, tx, org, id, req); err == nil {
			err = m.CheckRevision(r.Revision)
		}
		if err != nil {
			return ownership.Response{}, err
		}
		return ownership.Answer(created, r.Project(token).JSON(), r.UID), nil
	})
}

// Delete releases reservation id under the four fences, in the mutation's one transaction,
// unless a deployment brake covers its worker.
func (s *Service) Delete(ctx context.Context, m *ownership.Mutation, org auth.Organization, id string) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		r, err := s.Get(ctx, tx, org, id)
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
