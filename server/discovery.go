package server

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
)

func (s *Server) healthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

// readyz answers 200 only while the database answers.
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
	defer cancel()
	if err := s.db.Ping(ctx); err != nil {
		s.log.WarnContext(ctx, "readiness check failed", "request_id", requestID(c), "error", err.Error())
		return apierr.New(apierr.Unavailable, "the database is not answering")
	}
	if newer := s.checkSchema(ctx); newer != nil {
		return schemaRefusal(newer)
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
}

// Capabilities is the body of GET /v1/capabilities. Its OrganizationID is the key's
// organization, which the runtime-input routes carry in their path.
type Capabilities = apitypes.Capabilities

func (s *Server) capabilities(c echo.Context) error {
	return c.JSON(http.StatusOK, Capabilities{
		Ownership:           []string{ownership.Protocol},
		ReservationFormats:  []string{reservation.FormatV2},
		RuntimeInputFormats: s.runtimeInputFormats(),
		Packs:               s.catalog.Packs(),
		OrganizationID:      principal(c).Organization.ID,
	})
}

// OfferingView is one entry of GET /v1/offerings. Its Ceilings bound a module-worker's limits on
// the offering (absent on other kinds).
type OfferingView = apitypes.Offering

func (s *Server) offerings(c echo.Context) error {
	p := principal(c)
	out := []OfferingView{}
	for _, o := range s.catalog.Visible(catalog.Organization{ID: p.Organization.ID, Name: p.Organization.Name}) {
		v := OfferingView{ID: o.ID, Kind: o.Kind, Pack: o.Pack, Installation: o.Installation, Digest: o.Digest}
		if o.Kind == catalog.KindWorker {
			c := apitypes.OfferingCeilings(o.Ceilings())
			v.Ceilings = &c
			bundle := o.BundleCeiling()
			v.MaxBundleBytes = &bundle
			if d := o.CronDelivery(); d != "" {
				v.CronDelivery = &d
			}
			if o.CustomDomains != nil {
				v.CustomDomains = &apitypes.OfferingCustomDomains{Target: o.CustomDomains.Target}
			}
		}
		out = append(out, v)
	}
	return c.JSON(http.StatusOK, map[string]any{"offerings": out})
}

func (s *Server) runtimeInputFormats() []string {
	if s.host.Ring == nil {
		return []string{} // nothing to seal with: advertising a format would promise what cannot be done
	}
	return []string{runtimeinput.PreparationFormat}
}
