package resource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Cron triggers on selfhost (SPEC 3.6). Each (worker, cron) row holds its next tick by database
// time; a Host replica claims a due tick by moving next_tick past now with a compare-and-swap, so
// one replica at most claims it, and records the claim (one row per scheduled tick, unique). It
// then asks the worker's node to run the tick id, which a node runs at most once and only before
// the deadline. A tick more than CronLate late (no Host ran meanwhile) is recorded missed, never
// run; one under a deployment brake is recorded braked.

// CronLate is how late a tick may run; past it the tick is missed.
const CronLate = 60 * time.Second

// ticksPerPass bounds the due ticks one pass reads, and duePerOrganization each organization's
// share of them.
const (
	ticksPerPass       = 100
	duePerOrganization = 8
)

// TickSlots are the ticks a replica may run at once: Take reserves one for a tick of org (false
// when the replica, or that organization's share of it, is full), Give returns it. One
// organization's slow handlers then hold back only its own ticks.
type TickSlots interface {
	Take(org string) bool
	Give(org string)
}

// Tick is a tick this replica claimed: Run it, and its outcome is recorded.
type Tick struct {
	backend.Tick
	Installation string
	Organization string
	Space, Name  string
}

// Settled is a tick recorded without being run (missed or braked), for the log.
type Settled struct {
	Tick
	Outcome dbsqlc.CronTickOutcome
	Missed  int
}

// ClaimTicks gives the rows new crons added their first tick, then claims the ticks due now: those
// it may run, each with a slot taken, are returned to Run; those it must not (missed, braked) are
// recorded and returned settled. A tick for which no slot is free is left unclaimed, for a later
// pass or another replica.
func (s *Service) ClaimTicks(ctx context.Context, db dbsqlc.DBTX, slots TickSlots) (run []Tick, settled []Settled, err error) {
	q := dbsqlc.New(db)
	fresh, err := q.CronsUnscheduled(ctx)
	if err != nil {
		return nil, nil, err
	}
	var errs []error
	for _, r := range fresh {
		sched, err := workerconf.ParseCron(r.Cron)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %s: %w", r.WorkerUID, err))
			continue
		}
		if _, err := q.CronSchedule(ctx, dbsqlc.CronScheduleParams{NextTick: sched.Next(r.Now), WorkerUID: r.WorkerUID, Cron: r.Cron}); err != nil {
			return nil, nil, err
		}
	}
	due, err := q.CronsDue(ctx, dbsqlc.CronsDueParams{PerOrganization: duePerOrganization, MaxRows: ticksPerPass})
	if err != nil {
		return nil, nil, err
	}
	for _, d := range due {
		sched, err := workerconf.ParseCron(d.Cron)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %s: %w", d.WorkerUID, err))
			continue
		}
		t := Tick{Tick: backend.Tick{ID: uuid.NewString(), ScriptName: d.ScriptName, WorkerUID: d.WorkerUID.String(), Cron: d.Cron,
			ScheduledTime: d.Due, Deadline: d.Due.Add(CronLate)}, Installation: d.Installation, Organization: d.OrganizationID, Space: d.Space, Name: d.Name}
		row := dbsqlc.CronTickInsertParams{ID: uuid.MustParse(t.ID), WorkerUID: d.WorkerUID, Cron: d.Cron, ScheduledFor: d.Due, Outcome: dbsqlc.CronTickOutcomeClaimed}
		late := d.Now.Sub(d.Due)
		braked := false
		if late <= CronLate {
			braked, err = q.BrakeEngaged(ctx, dbsqlc.BrakeEngagedParams{OrganizationID: &d.OrganizationID, Space: &d.Space, WorkerName: &d.Name})
			if err != nil {
				return run, settled, err
			}
		}
		runs := late <= CronLate && !braked
		if runs && !slots.Take(d.OrganizationID) {
			continue // no slot: left due, unclaimed
		}
		claimed, err := q.CronClaim(ctx, dbsqlc.CronClaimParams{NextTick: sched.Next(d.Now), WorkerUID: d.WorkerUID, Cron: d.Cron, Due: d.Due})
		if err != nil || claimed == 0 {
			if runs {
				slots.Give(d.OrganizationID)
			}
			if err != nil {
				return run, settled, err
			}
			continue // another replica claimed it
		}
		switch {
		case late > CronLate:
			missed := 0
			for at := d.Due; !at.IsZero() && !at.After(d.Now) && missed < 100000; at = sched.Next(at) {
				missed++
			}
			row.Outcome, row.Missed = dbsqlc.CronTickOutcomeMissed, int32(missed)
			row.Detail = fmt.Sprintf("%d tick(s) from this one on came more than %s late (no Host ran cron ticks meanwhile): not run", missed, CronLate)
			settled = append(settled, Settled{Tick: t, Outcome: row.Outcome, Missed: missed})
		case braked:
			row.Outcome, row.Detail = dbsqlc.CronTickOutcomeBraked, "a deployment brake covers the worker: not run"
			settled = append(settled, Settled{Tick: t, Outcome: row.Outcome})
		}
		// The claim's record first: a second claim of the same tick (which the compare-and-swap
		// already prevents) could not insert it, and would run nothing.
		if err := q.CronTickInsert(ctx, row); err != nil {
			if runs {
				slots.Give(d.OrganizationID)
			}
			return run, settled, err
		}
		if runs {
			run = append(run, t)
		}
		if _, err := q.CronTicksTrim(ctx, d.WorkerUID); err != nil {
			return run, settled, err
		}
	}
	return run, settled, errors.Join(errs...)
}

// checkCronCeiling refuses crons past a Cloudflare installation's cronCeiling (Cloudflare caps
// cron triggers per account), counting every other worker's of the installation under its
// script-slot locks; a write without crons, or on a selfhost installation, asks nothing.
func (s *Service) checkCronCeiling(ctx context.Context, q *dbsqlc.Queries, installation string, writing uuid.UUID, crons []string) error {
	inst, ok := s.Catalog.Installations[installation]
	if len(crons) == 0 || !ok || inst.Pack == catalog.PackSelfhost {
		return nil
	}
	used, err := q.InstallationCronCount(ctx, dbsqlc.InstallationCronCountParams{Installation: installation, Writing: writing})
	if err != nil {
		return err
	}
	if ceiling := inst.Crons(); used+int64(len(crons)) > int64(ceiling) {
		return apierr.New(apierr.QuotaExceeded, "installation %s holds %d cron triggers across every organization it serves, and its ceiling is %d: %d more do not fit; remove crons elsewhere or ask an operator for another offering",
			installation, used, ceiling, len(crons)).With("quota", map[string]any{"resource": "installationCrons", "ceiling": ceiling})
	}
	return nil
}

// abandonedAfter is how long after its tick a claimed tick with no outcome is failed: its
// deadline (CronLate) and the longest a node may run it, with room.
const abandonedAfter = 5 * time.Minute

// SettleAbandonedTicks fails the ticks a stopped replica claimed and never recorded (the janitor).
func (s *Service) SettleAbandonedTicks(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return dbsqlc.New(db).CronTicksAbandoned(ctx, abandonedAfter.Seconds())
}

// RunTick asks the node of t's installation to run it, again while the node cannot be reached and
// the deadline has not passed (the node runs a tick id once, so asking again is safe), and records
// the outcome.
func (s *Service) RunTick(ctx context.Context, db dbsqlc.DBTX, t Tick) (dbsqlc.CronTickOutcome, string) {
	outcome, detail := s.runTick(ctx, t)
	// Recorded even when ctx ended (a Host shutting down): the record is what the worker's
	// owner reads.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = dbsqlc.New(db).CronTickFinish(rctx, dbsqlc.CronTickFinishParams{Outcome: outcome, Detail: detail, ID: uuid.MustParse(t.ID)})
	return outcome, detail
}

func (s *Service) runTick(ctx context.Context, t Tick) (dbsqlc.CronTickOutcome, string) {
	inst, ok := s.Catalog.Installations[t.Installation]
	if !ok {
		return dbsqlc.CronTickOutcomeFailed, "installation " + t.Installation + " is no longer in the catalog"
	}
	mut, err := s.Backends.Mutator(inst)
	if err != nil {
		return dbsqlc.CronTickOutcomeFailed, err.Error()
	}
	runner, ok := backend.As[backend.CronRunner](mut)
	if !ok {
		return dbsqlc.CronTickOutcomeFailed, "installation " + t.Installation + " runs no cron ticks for the Host"
	}
	for {
		cctx, cancel := context.WithDeadline(ctx, t.Deadline.Add(30*time.Second))
		out, err := runner.RunTick(cctx, t.Tick)
		cancel()
		switch {
		case err == nil && out.OK:
			return dbsqlc.CronTickOutcomeOk, ""
		case err == nil:
			return dbsqlc.CronTickOutcomeException, out.Detail
		case !errors.Is(err, backend.ErrUnreachable) || time.Now().After(t.Deadline) || ctx.Err() != nil:
			return dbsqlc.CronTickOutcomeFailed, "the runtime node did not run the tick: " + err.Error()
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}
