package resource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// LogReader reads one worker's log (see backend.LogSource.WorkerLogs).
type LogReader func(ctx context.Context, q backend.LogQuery, each func(backend.LogEntry) error, flush func() error) error

// WorkerLogs finds the present worker space/name of org (another organization's is not found)
// and returns the reader of its log on its backend. It reads the database once and holds no
// transaction: the reading is backend calls only.
func (s *Service) WorkerLogs(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, space, name string) (LogReader, error) {
	st, err := dbsqlc.New(db).WorkerGet(ctx, dbsqlc.WorkerGetParams{OrganizationID: org.ID, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !st.Present) {
		return nil, apierr.New(apierr.NotFound, "no worker %s/%s", space, name)
	}
	if err != nil {
		return nil, fmt.Errorf("resource: get worker for its logs: %w", err)
	}
	inst, ok := s.Catalog.Installations[st.Installation]
	if !ok {
		return nil, apierr.New(apierr.PlacementDrift, "installation %q is no longer in the catalog; the worker's logs cannot be read there", st.Installation)
	}
	src, err := s.Backends.LogSource(inst)
	if errors.Is(err, backend.ErrNotImplemented) {
		return nil, apierr.New(apierr.LogsUnsupported, "the %s backend pack does not offer worker logs; only workers on a selfhost runtime node have them", inst.Pack)
	}
	if err != nil {
		return nil, err
	}
	script, uid := st.ScriptName, st.UID
	return func(ctx context.Context, q backend.LogQuery, each func(backend.LogEntry) error, flush func() error) error {
		err := src.WorkerLogs(ctx, script, uid, q, each, flush)
		if errors.Is(err, backend.ErrUnreachable) {
			return apierr.New(apierr.BackendUnreachable, "the worker's runtime node could not be reached for its logs; try again")
		}
		return err
	}, nil
}
