package resource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
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
		if q.Follow {
			flush = endsWithItsWorker(ctx, db, org, space, name, uid, flush)
		}
		err := src.WorkerLogs(ctx, script, uid, q, each, flush)
		if errors.Is(err, errWorkerGone) {
			return nil // a follow stream ends with its worker
		}
		if errors.Is(err, backend.ErrUnreachable) {
			return apierr.New(apierr.BackendUnreachable, "the worker's runtime node could not be reached for its logs; try again")
		}
		return err
	}, nil
}

// workerCheckEvery is how often a follow stream looks whether its worker is still there.
var workerCheckEvery = 5 * time.Second

// errWorkerGone ends a follow stream whose worker was deleted (or replaced under its name).
var errWorkerGone = errors.New("resource: the worker of this log is gone")

// endsWithItsWorker wraps a follow stream's flush (called after each page, at least every long
// poll) so that the stream ends once its worker UID is no longer the present worker of its name:
// otherwise it would wait for entries that never come, holding a connection here and a long poll
// on the node. A failed read of the database ends nothing.
func endsWithItsWorker(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, space, name string, uid uuid.UUID, flush func() error) func() error {
	checked := time.Now()
	return func() error {
		if err := flush(); err != nil {
			return err
		}
		if time.Since(checked) < workerCheckEvery {
			return nil
		}
		checked = time.Now()
		st, err := dbsqlc.New(db).WorkerGet(ctx, dbsqlc.WorkerGetParams{OrganizationID: org.ID, Space: space, Name: name})
		switch {
		case errors.Is(err, pgx.ErrNoRows), err == nil && (!st.Present || st.UID != uid):
			return errWorkerGone
		}
		return nil
	}
}
