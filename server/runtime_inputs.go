package server

import (
	"context"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
)

// pathOrganization refuses a path organization other than the key's (SPEC 3: 403).
func pathOrganization(c echo.Context) error {
	if c.Param("organizationId") != principal(c).Organization.ID {
		return apierr.New(apierr.Forbidden, "the path names another organization than this API key's")
	}
	return nil
}

func (s *Server) getPreparation(c echo.Context) error {
	if err := pathOrganization(c); err != nil {
		return err
	}
	p, token, err := s.runtimeInputs.Get(c.Request().Context(), s.db, principal(c).Organization, c.Param("operationId"))
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, p.Project(token).JSON())
}

// getPreparationByReference answers the status of the runtime input a reference names, within
// the key's organization only (SPEC 3.5).
func (s *Server) getPreparationByReference(c echo.Context) error {
	p, token, err := s.runtimeInputs.GetByReference(c.Request().Context(), s.db, principal(c).Organization, c.Param("reference"))
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, p.Project(token).JSON())
}

// putPreparation seals a runtime input, in one transaction (it has no backend effect).
func (s *Server) putPreparation(c echo.Context) error {
	if err := pathOrganization(c); err != nil {
		return err
	}
	id := c.Param("operationId")
	if err := runtimeinput.CheckOperationID(id); err != nil {
		return err
	}
	org := principal(c).Organization
	var req runtimeinput.Request
	// The request hash is taken over the body with its values blanked: the reference commits to
	// them, and no unkeyed digest of a secret is kept.
	return s.ownedPutHashing(c, runtimeinput.Kind, id, runtimeinput.ResourceType, &req, runtimeinput.HashBody,
		func() *ownership.BrakeScope {
			return &ownership.BrakeScope{Space: req.Target.Space, Worker: req.Target.WorkerName}
		},
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			return s.runtimeInputs.Put(ctx, m, org, id, req, token)
		})
}

// deletePreparation ends a preparation in any state with 200 and a tombstone (SPEC 3.5), in one
// transaction.
func (s *Server) deletePreparation(c echo.Context) error {
	if err := pathOrganization(c); err != nil {
		return err
	}
	id := c.Param("operationId")
	org := principal(c).Organization
	return s.ownedDelete(c, runtimeinput.Kind, id, runtimeinput.ResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.runtimeInputs.Delete(ctx, m, org, id)
		})
}

// commitmentKey answers the key a rip2 reference commits values under (SPEC 3.5). It writes
// nothing, and its answer is never to be cached anywhere on the way.
func (s *Server) commitmentKey(c echo.Context) error {
	var req runtimeinput.CommitmentKeyRequest
	if _, err := s.decodeJSON(c, &req); err != nil {
		return err
	}
	k, err := s.runtimeInputs.CommitmentKey(c.Request().Context(), s.db, principal(c).Organization, req)
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusOK, k)
}
