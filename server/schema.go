package server

import (
	"context"
	"errors"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// checkSchema reads the database's schema version and remembers whether a newer release has
// migrated it past this binary. The first time it finds so it logs both versions; from then on
// every API request answers 503 (and /readyz too, so that a load balancer takes this replica out)
// rather than failing on a schema it does not know. It answers the refusal, or nil.
func (s *Server) checkSchema(ctx context.Context) *store.SchemaNewer {
	s.schemaChecked.Store(time.Now().UnixNano())
	err := store.CheckSchema(ctx, s.db)
	var newer *store.SchemaNewer
	if !errors.As(err, &newer) {
		if err == nil {
			s.schemaNewer.Store(nil)
		}
		return s.schemaNewer.Load()
	}
	if s.schemaNewer.Swap(newer) == nil {
		s.log.Error("the database's schema is newer than this takoserver: it stops serving; run the newer release",
			"database_schema_version", newer.Database, "binary_schema_version", newer.Binary)
	}
	return newer
}

// schemaRefusal is the answer of a replica whose database moved past it.
func schemaRefusal(newer *store.SchemaNewer) error {
	return apierr.New(apierr.Unavailable, "this Host replica is older than its database (schema version %d, this replica knows %d); retry: another replica answers", newer.Database, newer.Binary)
}

// schemaRecheck is how often a refusing replica reads the schema version again without a
// /readyz asking it to.
const schemaRecheck = 5 * time.Second

// refuseWhenSchemaNewer answers 503 on a replica that found its database migrated past it, until
// the database is back at a version it knows.
func (s *Server) refuseWhenSchemaNewer(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		newer := s.schemaNewer.Load()
		if newer != nil && time.Since(time.Unix(0, s.schemaChecked.Load())) > schemaRecheck {
			ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
			newer = s.checkSchema(ctx)
			cancel()
		}
		if newer != nil {
			return schemaRefusal(newer)
		}
		return next(c)
	}
}

// schemaMismatch is what a request that failed on the database's schema answers: the refusal when
// the database has moved past this binary, nothing otherwise (a 500 as any other failure).
func (s *Server) schemaMismatch(c echo.Context, err error) error {
	if !store.SchemaMismatch(err) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request().Context()), 2*time.Second)
	defer cancel()
	if newer := s.checkSchema(ctx); newer != nil {
		return schemaRefusal(newer)
	}
	return nil
}
