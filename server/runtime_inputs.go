package server

import (
	"context"
	"net/http"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
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
	org := principal(c).Organization
	var req runtimeinput.Request
	// The request hash is taken over the body with its values blanked: the reference commits to
	// them, and no unkeyed digest of a secret is kept.
	return s.ownedPutHashing(c, runtimeinput.Kind, id, runtimeinput.ResourceType, &req, runtimeinput.HashBody,
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			return createOrReconcile(ctx, m,
				func(tx pgx.Tx) (runtimeinput.Preparation, uuid.UUID, error) {
					p, err := s.runtimeInputs.Prepare(ctx, tx, org, id, req)
					return p, p.MaterialSetID, err
				},
				func(tx pgx.Tx) (runtimeinput.Preparation, uuid.UUID, error) {
					p, err := s.runtimeInputs.Reconcile(ctx, tx, org, id, req)
					return p, p.MaterialSetID, err
				},
				func(p runtimeinput.Preparation) []byte { return p.Project(token).JSON() })
		})
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
