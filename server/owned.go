package server

import (
	"context"
	"strconv"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
)

// ownedPut decodes the JSON body into v and runs an owned PUT of (kind, key); effect gets the
// mutation and the request's token.
// brake, when set, names (from the decoded body) the worker the PUT changes, so that the lock step
// checks the deployment brake.
func (s *Server) ownedPut(c echo.Context, kind, key, resourceType string, v any, brake func() *ownership.BrakeScope,
	effect func(context.Context, *ownership.Mutation, string) (ownership.Response, error)) error {
	return s.ownedPutHashing(c, kind, key, resourceType, v, nil, brake, effect)
}

// ownedPutHashing is ownedPut with the body the request hash is taken over rewritten by hashBody
// first (for bodies that carry secrets).
func (s *Server) ownedPutHashing(c echo.Context, kind, key, resourceType string, v any, hashBody func([]byte) ([]byte, error),
	brake func() *ownership.BrakeScope, effect func(context.Context, *ownership.Mutation, string) (ownership.Response, error)) error {
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	ifMatch, err := ifMatchRevision(c)
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
	in := s.intent(c, kind, key, resourceType, key, token, raw)
	in.IfMatch = ifMatch
	if brake != nil {
		in.Brake = brake()
	}
	resp, err := s.owners.Put(c.Request().Context(), in, func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
		return effect(ctx, m, token)
	})
	setOperation(c, resp)
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

// ownedDelete runs an owned DELETE of (kind, key); brake as for ownedPut (from the path).
func (s *Server) ownedDelete(c echo.Context, kind, key, resourceType string, brake *ownership.BrakeScope, effect ownership.Effect) error {
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	ifMatch, err := ifMatchRevision(c)
	if err != nil {
		return err
	}
	if _, err := s.readBody(c); err != nil {
		return err
	}
	in := s.intent(c, kind, key, resourceType, key, token, nil)
	in.IfMatch = ifMatch
	in.Brake = brake
	resp, err := s.owners.Delete(c.Request().Context(), in, effect)
	setOperation(c, resp)
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

// ifMatchRevision reads If-Match: the revision the client last read (SPEC 3.2). Quotes, as an
// entity tag would carry, are accepted.
func ifMatchRevision(c echo.Context) (*int64, error) {
	raw := strings.TrimSpace(c.Request().Header.Get("If-Match"))
	if raw == "" {
		return nil, nil
	}
	n, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(raw, "W/"), `"`), 10, 64)
	if err != nil || n < 1 {
		return nil, apierr.New(apierr.InvalidRequest, "If-Match must be the object's revision, a positive integer")
	}
	return &n, nil
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
