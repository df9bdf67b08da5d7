package server

import (
	"context"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
)

func (s *Server) getReservation(c echo.Context) error {
	id := c.Param("reservationId")
	return s.readOwned(c, reservation.Kind, id, func(ctx context.Context, tx pgx.Tx, token string) ([]byte, error) {
		r, err := s.reservations.Get(ctx, tx, principal(c).Organization, id)
		return r.Project(token).JSON(), err
	})
}

func (s *Server) putReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	var req reservation.Request
	return s.ownedPut(c, reservation.Kind, id, reservation.ResourceType, &req,
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			return createOrReconcile(ctx, m,
				func(tx pgx.Tx) (reservation.Reservation, uuid.UUID, error) {
					r, err := s.reservations.Create(ctx, tx, org, id, req)
					return r, r.UID, err
				},
				func(tx pgx.Tx) (reservation.Reservation, uuid.UUID, error) {
					r, err := s.reservations.Reconcile(ctx, tx, org, id, req)
					return r, r.UID, err
				},
				func(r reservation.Reservation) []byte { return r.Project(token).JSON() })
		})
}

func (s *Server) deleteReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, reservation.Kind, id, reservation.ResourceType,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			var r reservation.Reservation
			err := m.Tx(ctx, func(tx pgx.Tx) error {
				if err := resource.CheckBrake(ctx, tx); err != nil {
					return err
				}
				var err error
				r, err = s.reservations.Release(ctx, tx, org, id, m.Current.UID)
				return err
			})
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: r.Project("").JSON(), UID: r.UID}, nil
		})
}
