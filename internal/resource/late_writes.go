package resource

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Late writes (SPEC 8, migration 17). On a pack without fences (backend.LateWritesUnfenced) an
// upload that got no answer, or that a stopped Host sent, may land after the Host read its script
// back absent: one read of absence is not final there. The transaction that decides such an apply
// did not land (recovery's, or a refusal's) records a re-check of its script, due LateWriteDelay
// of database time after that decision. For recovery that decision comes after the stopped
// Host's lease expired, which is after its last call started, so the delay is measured from the
// later of the two. The janitor then reads the script again (RecheckLateWrites) and takes down a
// script that landed for a worker that no longer stands; the script's TAKOFORM_WORKER_UID says
// whose it is, and one another worker holds is never touched. While a re-check of a name is
// pending, no new worker takes that name (checkLateWrites), so a late upload never overwrites a
// newer worker's script.

// LateWriteMargin is what a late-write re-check waits beyond BackendCallTimeout: the backend may
// work on a request a little after its caller gave up (a request still in a socket buffer, a
// Cloudflare worker finishing its upload).
const LateWriteMargin = 30 * time.Second

// LateWriteDelay is how long after an apply was decided not to have landed its script is read
// again: the backend's longest call plus the margin.
const LateWriteDelay = BackendCallTimeout + LateWriteMargin

// lateWriteClaim is how long one janitor keeps a due re-check from the others: its read, its
// delete and its read back, each bounded by BackendCallTimeout.
const lateWriteClaim = 3*BackendCallTimeout + 15*time.Second

// openRecheck records, in the transaction deciding that o's apply did not land, the re-check of
// its script when the upload may still land: a worker's apply on a pack without fences that the
// backend did not confirm holding.
func (s *Service) openRecheck(ctx context.Context, q *dbsqlc.Queries, org, installation string, o outcome) error {
	if o.pl.action != dbsqlc.EffectActionApply || o.pl.desired.Kind != backend.NativeWorker || o.present || !o.late {
		return nil
	}
	inst, ok := s.Catalog.Installations[installation]
	if !ok || !backend.LateWritesUnfenced(inst.Pack) {
		return nil
	}
	if err := q.LateWriteRecheckOpen(ctx, dbsqlc.LateWriteRecheckOpenParams{
		DeploymentID: o.pl.deployment, OrganizationID: org, Installation: installation,
		ScriptName: o.pl.desired.NativeName, WorkerUID: o.pl.desired.ResourceUID, AfterSeconds: LateWriteDelay.Seconds(),
	}); err != nil {
		return fmt.Errorf("resource: record the late-write re-check of %s: %w", o.pl.desired.NativeName, err)
	}
	return nil
}

// checkLateWrites refuses, retryable, a worker create that would take a script name whose
// re-check is pending: an upload of the name's former worker may still land and would overwrite
// this worker's script. It runs after the create's row is written in the same transaction, so
// a re-check committed with the former worker's abandonment (which freed the name) is seen.
func checkLateWrites(ctx context.Context, q *dbsqlc.Queries, w Worker) error {
	if !backend.LateWritesUnfenced(w.Placement.Pack) {
		return nil
	}
	pending, err := q.LateWriteRecheckPending(ctx, dbsqlc.LateWriteRecheckPendingParams{
		Installation: w.Placement.Installation, ScriptName: w.ScriptName, UID: w.UID,
	})
	if err != nil {
		return fmt.Errorf("resource: late-write re-checks: %w", err)
	}
	if pending {
		return apierr.New(apierr.WitnessOpen, "script %s may still receive a late upload from an interrupted create of an earlier worker under this name; the Host reads it again within about %d seconds and takes such a script down; retry shortly",
			w.ScriptName, int(LateWriteDelay.Seconds())).With("unmetFences", []string{"late_write_recheck"})
	}
	return nil
}

// LateWrite is one re-check's finding that the janitor reports.
type LateWrite struct {
	Installation string
	ScriptName   string
	WorkerUID    uuid.UUID
	// Deployment is the deployment re-checked; Held is the one the script held when read.
	Deployment uuid.UUID
	Held       uuid.UUID
	// Status is the re-check's settled status (migration 17).
	Status dbsqlc.LateWriteStatus
}

// RecheckLateWrites runs the due late-write re-checks, for the janitor: each reads its script
// again and takes down one that landed for a worker that no longer stands (compare-and-delete on
// the worker UID, read back). Any number of replicas may run it: a re-check is claimed, its delete
// touches only that worker's script, and only the first settle of it counts. It reports what it
// settled; an unreadable backend leaves the re-check pending for the next sweep.
func (s *Service) RecheckLateWrites(ctx context.Context, db interface {
	store.Beginner
	dbsqlc.DBTX
}) ([]LateWrite, error) {
	rows, err := dbsqlc.New(db).LateWriteRechecksClaim(ctx, lateWriteClaim.Seconds())
	if err != nil {
		return nil, fmt.Errorf("resource: due late-write re-checks: %w", store.Classify(err))
	}
	var out []LateWrite
	var firstErr error
	for _, r := range rows {
		lw, err := s.recheck(ctx, db, r)
		if err != nil {
			if firstErr == nil {
				firstErr = err
			}
			continue
		}
		if lw != nil {
			out = append(out, *lw)
		}
	}
	return out, firstErr
}

func (s *Service) recheck(ctx context.Context, db store.Beginner, r dbsqlc.LateWriteRechecksClaimRow) (*LateWrite, error) {
	lw := &LateWrite{Installation: r.Installation, ScriptName: r.ScriptName, WorkerUID: r.WorkerUID, Deployment: r.DeploymentID}
	mut, err := s.mutator(Placement{Installation: r.Installation})
	if apierr.Is(err, apierr.PlacementDrift) {
		lw.Status = dbsqlc.LateWriteStatusUnobservable
		return s.settleRecheck(ctx, db, r, lw, "its installation left the catalog; the script cannot be read")
	}
	if err != nil {
		return nil, err
	}
	obs, err := observeFor(ctx, mut, r.ScriptName)
	if err != nil {
		return nil, fmt.Errorf("resource: re-check script %s: %w", r.ScriptName, err)
	}
	lw.Held = obs.DeploymentID
	switch {
	case !obs.Present:
		lw.Status = dbsqlc.LateWriteStatusAbsent
		return s.settleRecheck(ctx, db, r, lw, "nothing landed")
	case obs.WorkerUID != r.WorkerUID.String():
		lw.Status = dbsqlc.LateWriteStatusOthers
		return s.settleRecheck(ctx, db, r, lw, "another worker holds the script; left alone")
	case r.WorkerStands:
		lw.Status = dbsqlc.LateWriteStatusKept
		return s.settleRecheck(ctx, db, r, lw, "its worker stands and the script is its own")
	}
	// The script landed for a worker that no longer stands: take it down. The delete compares
	// the worker UID first, so it never removes another worker's script.
	d := backend.Desired{Kind: backend.NativeWorker, NativeName: r.ScriptName, DeploymentID: r.DeploymentID, EffectID: uuid.New(), ResourceUID: r.WorkerUID}
	dctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	err = mut.Delete(dctx, d)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("resource: take down late script %s: %w", r.ScriptName, err)
	}
	if obs, err = observeFor(ctx, mut, r.ScriptName); err != nil {
		return nil, fmt.Errorf("resource: read back late script %s: %w", r.ScriptName, err)
	}
	if obs.Present && obs.WorkerUID == r.WorkerUID.String() {
		return nil, fmt.Errorf("resource: late script %s still reads back after its delete", r.ScriptName)
	}
	lw.Status = dbsqlc.LateWriteStatusRemoved
	return s.settleRecheck(ctx, db, r, lw, fmt.Sprintf("a script of deployment %s landed after its apply was decided lost; taken down", lw.Held))
}

func observeFor(ctx context.Context, mut backend.Mutator, script string) (backend.Observation, error) {
	ctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	defer cancel()
	return mut.Observe(ctx, backend.NativeWorker, script)
}

// settleRecheck records what the re-check found (lw.Status); a removal is also recorded as a janitor
// operation with a succeeded delete effect of the deployment, so that the operator sees it in the
// ledger. It answers nil when another replica settled the re-check first.
func (s *Service) settleRecheck(ctx context.Context, db store.Beginner, r dbsqlc.LateWriteRechecksClaimRow, lw *LateWrite, detail string) (*LateWrite, error) {
	first := false
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		n, err := q.LateWriteRecheckSettle(ctx, dbsqlc.LateWriteRecheckSettleParams{Status: lw.Status, Detail: &detail, DeploymentID: r.DeploymentID})
		if err != nil || n == 0 {
			return err
		}
		first = true
		if lw.Status != dbsqlc.LateWriteStatusRemoved {
			return nil
		}
		op := uuid.Must(uuid.NewV7())
		code := "late_write_removed"
		if err := q.OperationRecord(ctx, dbsqlc.OperationRecordParams{
			ID: op, OrganizationID: r.OrganizationID, Kind: "janitor", ExternalKey: r.DeploymentID.String(), Method: "DELETE", Status: dbsqlc.OperationStatusCommitted, Code: &code,
		}); err != nil {
			return err
		}
		_, err = recordCompensation(ctx, q, r.OrganizationID, op, outcome{pl: planned{deployment: r.DeploymentID, action: dbsqlc.EffectActionDelete}, done: true})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("resource: settle the late-write re-check of %s: %w", r.ScriptName, err)
	}
	if !first {
		return nil, nil
	}
	return lw, nil
}
