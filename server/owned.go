package server

import (
	"context"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// ownedPut decodes the JSON body into v and runs an owned PUT of (kind, key); effect gets the
// mutation and the request's token.
func (s *Server) ownedPut(c echo.Context, kind, key, resourceType string, v any, effect func(context.Context, *ownership.Mutation, string) (ownership.Response, error)) error {
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	raw, err := s.decodeJSON(c, v)
	if err != nil {
		return err
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
