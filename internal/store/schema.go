package store

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/takoform/terraform-provider-takoform/migrations"
)

// SchemaVersion is the schema version this binary was built with: its highest embedded migration.
func SchemaVersion() uint {
	schemaOnce.Do(func() {
		entries, _ := fs.ReadDir(migrations.FS, ".")
		for _, e := range entries {
			head, _, ok := strings.Cut(e.Name(), "_")
			if v, err := strconv.ParseUint(head, 10, 32); ok && err == nil && uint(v) > schemaVersion {
				schemaVersion = uint(v)
			}
		}
	})
	return schemaVersion
}

var (
	schemaOnce    sync.Once
	schemaVersion uint
)

// SchemaNewer is the refusal of a binary older than its database: another release migrated the
// database past what this one knows, so its queries may fail in ways it cannot explain. It must
// stop serving and be replaced by the newer release.
type SchemaNewer struct {
	Database, Binary uint
}

func (e *SchemaNewer) Error() string {
	return fmt.Sprintf("the database is at schema version %d, newer than this takoserver's %d: a newer release migrated it; run that release (this one cannot serve it)", e.Database, e.Binary)
}

// CheckSchema reads the database's schema version and answers a *SchemaNewer when it is past
// this binary's. A database with no version yet, or one at or below this binary's, is nil.
func CheckSchema(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) error {
	var version int64
	var dirty bool
	err := db.QueryRow(ctx, `SELECT version, dirty FROM schema_migrations LIMIT 1`).Scan(&version, &dirty)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pgx.ErrNoRows), errors.As(err, &pgErr) && pgErr.Code == "42P01": // no table yet
		return nil
	case err != nil:
		return fmt.Errorf("read the schema version: %w", Classify(err))
	}
	if uint(version) > SchemaVersion() {
		return &SchemaNewer{Database: uint(version), Binary: SchemaVersion()}
	}
	return nil
}

// SchemaMismatch reports whether err is the kind of error a query written for another schema
// gets (SQLSTATE class 42: an undefined table, column or function, a changed view, a wrong type).
func SchemaMismatch(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "42")
}
