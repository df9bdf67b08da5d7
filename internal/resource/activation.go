package resource

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Activate activates a supplied reservation with the exact endpoint recorded on it (SPEC 3.3,
// activation), in one transaction.
func (s *Service) Activate(ctx context.Context, m *ownership.Mutation, org auth.Organization, reservationID string, endpointUID uuid.UUID) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		q := dbsqlc.New(tx)
		e, err := readEndpoint(ctx, q, org.ID, &endpointUID, "", "")
		if err != nil || !e.Present {
			return ownership.Response{}, apierr.New(apierr.NotFound, "no endpoint with uid %s", endpointUID)
		}
		if err := ownership.CheckBrake(ctx, tx, org.ID, e.Space, e.WorkerName); err != nil {
			return ownership.Response{}, err
		}
		if !e.Ready() {
			return ownership.Response{}, apierr.New(apierr.ActivationMismatch, "endpoint %s/%s is not Ready (%s)", e.Space, e.Name, e.conditions()[0].Reason)
		}
		r, err := s.Reservations.Activate(ctx, tx, org.ID, reservationID, e.incarnation())
		if err == nil {
			// Nothing new on a custom domain no longer verified (SPEC 3.7).
			err = reservation.CheckServable(ctx, tx, r)
		}
		if err != nil {
			return ownership.Response{}, err
		}
		return ownership.Answer(m.Current == nil, r.Project("").JSON(), r.UID), nil
	})
}

// Deactivate ends a supplied reservation's activation, keeping the endpoint as its witness, in
// one transaction.
func (s *Service) Deactivate(ctx context.Context, m *ownership.Mutation, org auth.Organization, reservationID string) (ownership.Response, error) {
	return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		r, _, err := s.Reservations.Get(ctx, tx, org, reservationID)
		if err != nil {
			return ownership.Response{}, err
		}
		if err := ownership.CheckBrake(ctx, tx, org.ID, r.Space, r.WorkerName); err != nil {
			return ownership.Response{}, err
		}
		if r, err = s.Reservations.Deactivate(ctx, tx, org.ID, reservationID); err != nil {
			return ownership.Response{}, err
		}
		return ownership.Answer(false, r.Project("").JSON(), r.UID), nil
	})
}
