package server

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

func (s *Server) reservationIntent(c echo.Context, id, token string, body []byte) ownership.Intent {
	return ownership.Intent{
		OrganizationID: principal(c).Organization.ID,
		Kind:           reservation.Kind,
		Key:            id,
		Token:          token,
		Method:         c.Request().Method,
		Path:           c.Request().URL.EscapedPath(),
		Body:           body,
		ResourceType:   reservation.ResourceType,
		ImportID:       id,
	}
}

func (s *Server) getReservation(c echo.Context) error {
	ctx := c.Request().Context()
	org := principal(c).Organization
	id := c.Param("reservationId")
	var body []byte
	err := store.WithTx(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		r, err := s.reservations.Get(ctx, tx, org, id)
		if err != nil {
			return err
		}
		tokens, err := ownership.Tokens(ctx, tx, org.ID, reservation.Kind, []string{id})
		if err != nil {
			return err
		}
		body = r.Project(tokens[id]).JSON()
		return nil
	})
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, body)
}

func (s *Server) putReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	var req reservation.Request
	raw, err := s.decodeJSON(c, &req)
	if err != nil {
		return err
	}
	org := principal(c).Organization
	resp, err := s.owners.Put(c.Request().Context(), s.reservationIntent(c, id, token, raw),
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			var r reservation.Reservation
			status := http.StatusOK
			err := m.Tx(ctx, func(tx pgx.Tx) error {
				if err := resource.CheckBrake(ctx, tx); err != nil {
					return err
				}
				var err error
				if m.Current == nil {
					status = http.StatusCreated
					if r, err = s.reservations.Create(ctx, tx, org, id, req); err != nil {
						return err
					}
					return m.Bind(ctx, tx, r.UID)
				}
				if m.Current.Pending {
					status = http.StatusCreated // resuming a create
				}
				r, err = s.reservations.Reconcile(ctx, tx, org, id, req)
				return err
			})
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: status, Body: r.Project(token).JSON(), UID: r.UID}, nil
		})
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}

func (s *Server) deleteReservation(c echo.Context) error {
	id := c.Param("reservationId")
	if err := reservation.CheckID(id); err != nil {
		return err
	}
	token, err := ownershipToken(c)
	if err != nil {
		return err
	}
	if _, err := s.readBody(c); err != nil {
		return err
	}
	org := principal(c).Organization
	resp, err := s.owners.Delete(c.Request().Context(), s.reservationIntent(c, id, token, nil),
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			var r reservation.Reservation
			err := m.Tx(ctx, func(tx pgx.Tx) error {
				if err := resource.CheckBrake(ctx, tx); err != nil {
					return err
				}
				var err error
				r, err = s.reservations.Release(ctx, tx, org, id, m.Current.UID)
				return err
			})
			if err != nil {
				return ownership.Response{}, err
			}
			return ownership.Response{Status: http.StatusOK, Body: r.Project("").JSON(), UID: r.UID}, nil
		})
	if err != nil {
		return err
	}
	return writeOwned(c, resp)
}
