package server

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/reservation"
)

// DerivationRequest is the body of POST /v1/worker-endpoint-origin-derivations.
type DerivationRequest struct {
	Space      string  `json:"space"`
	WorkerName string  `json:"workerName"`
	Subdomain  *string `json:"subdomain,omitempty"`
	OfferingID *string `json:"offeringId,omitempty"`
}

// derive answers the origin a reservation for the worker would hold, running the same derivation
// as the real mutation path and writing nothing. The provider calls it at plan time.
func (s *Server) derive(c echo.Context) error {
	var req DerivationRequest
	if _, err := s.decodeJSON(c, &req); err != nil {
		return err
	}
	d, err := s.reservations.Derive(principal(c).Organization, reservation.Request{
		Space: req.Space, WorkerName: req.WorkerName, Subdomain: req.Subdomain, OfferingID: req.OfferingID,
	})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, d)
}
