package server

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
)

func (s *Server) getReservation(c echo.Context) error {
	id := c.Param("reservationId")
	return s.readOwned(c, reservation.Kind, id, func(ctx context.Context, token string) ([]byte, error) {
		r, err := s.reservations.Get(ctx, s.cfg.DB, principal(c).Organization, id)
		return r.Project(token).JSON(), err
	})
}

// putReservation creates a reservation, or answers its owner's unchanged request, in one
// transaction (it has no backend effect).
func (s *Server) putReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	var req reservation.Request
	return s.ownedPut(c, reservation.Kind, id, reservation.ResourceType, &req,
		func() *ownership.BrakeScope { return &ownership.BrakeScope{Space: req.Space, Worker: req.WorkerName} },
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			return oneTx(ctx, m,
				func(tx pgx.Tx) (reservation.Reservation, error) {
					return s.reservations.Create(ctx, tx, org, id, req)
				},
				func(tx pgx.Tx) (reservation.Reservation, error) {
					r, err := s.reservations.Reconcile(ctx, tx, org, id, req)
					if err == nil {
						err = m.CheckRevision(r.Revision)
					}
					return r, err
				},
				func(r reservation.Reservation, created bool) ownership.Response {
					return ownership.Response{Status: createdStatus(created), Body: r.Project(token).JSON(), UID: r.UID}
				})
		})
}

// deleteReservation releases a reservation under the four fences, in one transaction.
func (s *Server) deleteReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, reservation.Kind, id, reservation.ResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return m.Commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
				r, err := s.reservations.Get(ctx, tx, org, id)
				if err == nil {
					err = resource.CheckBrake(ctx, tx, org.ID, r.Space, r.WorkerName)
				}
				if err == nil {
					r, err = s.reservations.Release(ctx, tx, org, id, m.Current.UID)
				}
				if err != nil {
					return ownership.Response{}, err
				}
				return ownership.Response{Status: http.StatusOK, Body: r.Project("").JSON(), UID: r.UID}, nil
			})
		})
}
