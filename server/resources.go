package server

import (
	"context"
	"net/http"

	"github.com/google/uuid"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
)

func (s *Server) getWorker(c echo.Context) error {
	view := c.QueryParam("modules")
	if view != "" && view != "full" && view != "digests" {
		return apierr.New(apierr.InvalidRequest, "modules=%q: it is full (the default) or digests", view)
	}
	w, token, err := s.resources.GetWorker(c.Request().Context(), s.db, principal(c).Organization, c.Param("space"), c.Param("name"))
	if err != nil {
		return err
	}
	p := w.Project(token)
	if view == "digests" {
		p = p.Digests()
	}
	return c.JSONBlob(http.StatusOK, p.JSON())
}

// getWorkerByUID reads a worker by its UID (what a service binding names).
func (s *Server) getWorkerByUID(c echo.Context) error {
	uid, err := uuid.Parse(c.Param("uid"))
	if err != nil {
		return apierr.New(apierr.NotFound, "no worker with uid %q", c.Param("uid"))
	}
	w, err := s.resources.GetWorkerByUID(c.Request().Context(), s.db, principal(c).Organization, uid)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, w.Project("").JSON())
}

func (s *Server) putWorker(c echo.Context) error {
	// A worker carries its bundle: its body may reach the largest bundle an offering takes
	// (base64 bytes modules included), and its own offering's ceiling is checked once it is read.
	c.Set(bodyLimitKey, s.workerBodyLimit)
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.WorkerSpec
	return s.ownedPut(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType, &spec,
		func() *ownership.BrakeScope { return &ownership.BrakeScope{Space: space, Worker: name} },
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			return s.resources.PutWorker(ctx, m, org, space, name, spec)
		})
}

func (s *Server) deleteWorker(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.WorkerKind, space+"/"+name, resource.WorkerResourceType,
		&ownership.BrakeScope{Space: space, Worker: name},
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.DeleteWorker(ctx, m, org, space, name)
		})
}

func (s *Server) getEndpoint(c echo.Context) error {
	e, token, err := s.resources.GetEndpoint(c.Request().Context(), s.db, principal(c).Organization, c.Param("space"), c.Param("name"))
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, e.Project(token).JSON())
}

func (s *Server) putEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	var spec resource.EndpointSpec
	return s.ownedPut(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType, &spec,
		func() *ownership.BrakeScope { return &ownership.BrakeScope{Space: space, Worker: spec.Worker} },
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			return s.resources.PutEndpoint(ctx, m, org, space, name, spec)
		})
}

func (s *Server) deleteEndpoint(c echo.Context) error {
	space, name := c.Param("space"), c.Param("name")
	org := principal(c).Organization
	return s.ownedDelete(c, resource.EndpointKind, space+"/"+name, resource.EndpointResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.DeleteEndpoint(ctx, m, org, space, name)
		})
}

// ActivationRequest is the body of PUT .../activation.
type ActivationRequest = apitypes.ActivationRequest

const (
	activationKind         = reservation.ActivationKind
	activationResourceType = "takoform_worker_endpoint_activation"
)

func (s *Server) putActivation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	var req ActivationRequest
	return s.ownedPut(c, activationKind, id, activationResourceType, &req, nil,
		func(ctx context.Context, m *ownership.Mutation, _ string) (ownership.Response, error) {
			endpointUID, err := uuid.Parse(req.EndpointUID)
			if err != nil {
				return ownership.Response{}, apierr.New(apierr.InvalidRequest, "endpointUid must be an endpoint's uid")
			}
			return s.resources.Activate(ctx, m, org, id, endpointUID)
		})
}

// getActivation reads an activated reservation with its activation's ownership token.
func (s *Server) getActivation(c echo.Context) error {
	r, token, err := s.reservations.GetActivation(c.Request().Context(), s.db, principal(c).Organization, c.Param("reservationId"))
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, r.Project(token).JSON())
}

func (s *Server) deleteActivation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, activationKind, id, activationResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.resources.Deactivate(ctx, m, org, id)
		})
}

func (s *Server) getAttestation(c echo.Context) error {
	uid, err := uuid.Parse(c.Param("uid"))
	if err != nil {
		return apierr.New(apierr.NotFound, "no deletion attestation %q", c.Param("uid"))
	}
	a, err := s.resources.Attestation(c.Request().Context(), s.db, principal(c).Organization.ID, uid)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, a)
}

func (s *Server) getOperation(c echo.Context) error {
	id, err := uuid.Parse(c.Param("id"))
	if err != nil {
		return apierr.New(apierr.NotFound, "no operation %q", c.Param("id"))
	}
	o, err := s.resources.Operation(c.Request().Context(), s.db, principal(c).Organization.ID, id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, o)
}
