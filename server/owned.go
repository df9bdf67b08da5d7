package server

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
)

// ownedPut decodes the JSON body into v and runs an owned PUT of (kind, key); effect gets the
// mutation and the request's token.
func (s *Server) ownedPut(c echo.Context, kind, key, resourceType string, v any, effect func(context.Context, *ownership.Mutation, string) (ownership.Response, error)) error {
	return s.ownedPutHashing(c, kind, key, resourceType, v, nil, effect)
}

// ownedPutHashing is ownedPut with the body the request hash is taken over rewritten by hashBody
// first (for bodies that carry secrets).
func (s *Server) ownedPutHashing(c echo.Context, kind, key, resourceType string, v any, hashBody func([]byte) ([]byte, error),
	effect func(context.Context, *ownership.Mutation, string) (ownership.Response, error)) error {
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	raw, err := s.decodeJSON(c, v)
	if err != nil {
		return err
	}
	if hashBody != nil {
		if raw, err = hashBody(raw); err != nil {
			return apierr.New(apierr.BadRequest, "invalid JSON body")
		}
	}
	resp, err := s.owners.Put(c.Request().Context(), s.intent(c, kind, key, resourceType, key, token, raw),
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return effect(ctx, m, token)
		})
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

// ownedDelete runs an owned DELETE of (kind, key).
func (s *Server) ownedDelete(c echo.Context, kind, key, resourceType string, effect ownership.Effect) error {
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	if _, err := s.readBody(c); err != nil {
		return err
	}
	resp, err := s.owners.Delete(c.Request().Context(), s.intent(c, kind, key, resourceType, key, token, nil), effect)
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

// createOrReconcile is the effect of an owned PUT whose object lives in one transaction: under
// the deployment brake, create it and bind the token in that transaction when nothing is bound,
// else reconcile the request with what is held. A create, or the resumption of one that did not
// finish, answers 201.
func createOrReconcile[T any](ctx context.Context, m *ownership.Mutation, create, reconcile func(pgx.Tx) (T, uuid.UUID, error), body func(T) []byte) (ownership.Response, error) {
	var obj T
	var uid uuid.UUID
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		if err := resource.CheckBrake(ctx, tx); err != nil {
			return err
		}
		var err error
		if m.Current == nil {
			if obj, uid, err = create(tx); err != nil {
				return err
			}
			return m.Bind(ctx, tx, uid)
		}
		obj, uid, err = reconcile(tx)
		return err
	})
	if err != nil {
		return ownership.Response{}, err
	}
	return ownership.Response{Status: createdStatus(m.Current == nil || m.Current.Pending), Body: body(obj), UID: uid}, nil
}

func (s *Server) intent(c echo.Context, kind, key, resourceType, importID, token string, body []byte) ownership.Intent {
	return ownership.Intent{
		OrganizationID: principal(c).Organization.ID,
		Kind:           kind,
		Key:            key,
		Token:          token,
		Method:         c.Request().Method,
		Path:           c.Request().URL.EscapedPath(),
		Body:           body,
		ResourceType:   resourceType,
		ImportID:       importID,
	}
}
