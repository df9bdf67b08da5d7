package server

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
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
	id := c.Param("operationId")
	return s.readOwned(c, runtimeinput.Kind, id, func(ctx context.Context, tx pgx.Tx, token string) ([]byte, error) {
		p, err := s.runtimeInputs.Get(ctx, tx, principal(c).Organization, id)
		return p.Project(token).JSON(), err
	})
}

func (s *Server) putPreparation(c echo.Context) error {
	if err := pathOrganization(c); err != nil {
		return err
	}
	id := c.Param("operationId")
	if err := runtimeinput.CheckOperationID(id); err != nil {
		return err
	}
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	var req runtimeinput.Request
	raw, err := s.decodeJSON(c, &req)
	if err != nil {
		return err
	}
	// The request hash is taken over the body with its values blanked: the reference commits to
	// them, and no unkeyed digest of a secret is kept.
	hashed, err := runtimeinput.HashBody(raw)
	if err != nil {
		return apierr.New(apierr.BadRequest, "invalid JSON body")
	}
	org := principal(c).Organization
	resp, err := s.owners.Put(c.Request().Context(), s.intent(c, runtimeinput.Kind, id, runtimeinput.ResourceType, id, token, hashed),
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			var p runtimeinput.Preparation
			status := createdStatus(m.Current == nil || m.Current.Pending)
			err := m.Tx(ctx, func(tx pgx.Tx) error {
				if err := resource.CheckBrake(ctx, tx); err != nil {
					return err
				}
				var err error
				if m.Current == nil {
					if p, err = s.runtimeInputs.Prepare(ctx, tx, org, id, req); err != nil {
						return err
					}
					return m.Bind(ctx, tx, p.MaterialSetID)
				}
				p, err = s.runtimeInputs.Reconcile(ctx, tx, org, id, req)
				return err
			})
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: status, Body: p.Project(token).JSON(), UID: p.MaterialSetID}, nil
		})
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

func (s *Server) deletePreparation(c echo.Context) error {
	if err := pathOrganization(c); err != nil {
		return err
	}
	id := c.Param("operationId")
	org := principal(c).Organization
	return s.ownedDelete(c, runtimeinput.Kind, id, runtimeinput.ResourceType,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			var p runtimeinput.Preparation
			err := m.Tx(ctx, func(tx pgx.Tx) error {
				var err error
				p, err = s.runtimeInputs.Abort(ctx, tx, org, id)
				return err
			})
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: p.Project("").JSON(), UID: p.MaterialSetID}, nil
		})
}
