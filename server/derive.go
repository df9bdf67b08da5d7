package server

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/reservation"
)

// DerivationRequest is the body of POST /v1/worker-endpoint-origin-derivations.
type DerivationRequest = reservation.DerivationRequest

// derive answers the origin a reservation would hold, and whether it is free, through the same
// derivation as the real mutation path. It needs only resources:read, takes no lock and writes
// nothing (SPEC 3.1).
func (s *Server) derive(c echo.Context) error {
	var req DerivationRequest
	if _, err := s.decodeJSON(c, &req); err != nil {
		return err
	}
	d, err := s.reservations.Derive(c.Request().Context(), s.db, principal(c).Organization, req)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}
