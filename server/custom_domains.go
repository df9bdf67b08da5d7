package server

import (
	"context"
	"net/http"
	"net/url"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// hostnameParam is the path's hostname, unescaped ("*" may come as %2A), on a Host that serves
// custom domains.
func (s *Server) hostnameParam(c echo.Context) (string, error) {
	if err := s.domains.Available(); err != nil {
		return "", err
	}
	h, err := url.PathUnescape(c.Param("hostname"))
	if err != nil {
		return "", apierr.New(apierr.InvalidRequest, "hostname is not a valid path segment")
	}
	return h, nil
}

func (s *Server) getCustomDomain(c echo.Context) error {
	hostname, err := s.hostnameParam(c)
	if err != nil {
		return err
	}
	org := principal(c).Organization
	d, token, err := s.domains.Get(c.Request().Context(), s.db, org, hostname)
	if err != nil {
		return err
	}
	return c.JSONBlob(http.StatusOK, wire.JSON(s.domains.Project(org, d, token)))
}

// putCustomDomain claims a custom domain (SPEC 3.7), its TXT record looked up first.
func (s *Server) putCustomDomain(c echo.Context) error {
	hostname, err := s.hostnameParam(c)
	if err != nil {
		return err
	}
	n, err := customdomain.Parse(s.catalog, hostname)
	if err != nil {
		return err
	}
	org := principal(c).Organization
	var req customdomain.Request
	return s.ownedPut(c, customdomain.Kind, hostname, customdomain.ResourceType, &req, nil,
		func(ctx context.Context, m *ownership.Mutation, token string) (ownership.Response, error) {
			return s.domains.Put(ctx, m, org, n, token)
		})
}

// deleteCustomDomain lets a claim go, refused while a reservation names it.
func (s *Server) deleteCustomDomain(c echo.Context) error {
	hostname, err := s.hostnameParam(c)
	if err != nil {
		return err
	}
	org := principal(c).Organization
	return s.ownedDelete(c, customdomain.Kind, hostname, customdomain.ResourceType, nil,
		func(ctx context.Context, m *ownership.Mutation) (ownership.Response, error) {
			return s.domains.Delete(ctx, m, org, hostname)
		})
}
