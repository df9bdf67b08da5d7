package server

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
)

func (s *Server) getReservation(c echo.Context) error {
	r, token, err := s.reservations.Get(c.Request().Context(), s.db, principal(c).Organization, c.Param("reservationId"))
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, r.Project(token).JSON())
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
			return s.reservations.Put(ctx, m, org, id, req, token)
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
			return s.reservations.Delete(ctx, m, org, id)
		})
}
