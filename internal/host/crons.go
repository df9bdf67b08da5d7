package host

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/resource"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// maxTicksRunning bounds the ticks one replica runs at once, and maxTicksPerOrganization one
// organization's share of them: a due tick beyond either waits, unclaimed, for a later pass or
// another replica, so that one organization's slow handlers hold back only its own ticks.
const (
	maxTicksRunning         = 32
	maxTicksPerOrganization = 4
)

// tickSlots are a replica's ticks running, in all and by organization (resource.TickSlots).
type tickSlots struct {
	running sync.WaitGroup
	mu      sync.Mutex
	total   int
	byOrg   map[string]int
}

func newTickSlots() *tickSlots { return &tickSlots{byOrg: map[string]int{}} }

func (s *tickSlots) Take(org string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.total >= maxTicksRunning || s.byOrg[org] >= maxTicksPerOrganization {
		return false
	}
	s.total++
	s.byOrg[org]++
	s.running.Add(1)
	return true
}

func (s *tickSlots) Give(org string) {
	s.mu.Lock()
	s.total--
	if s.byOrg[org]--; s.byOrg[org] == 0 {
		delete(s.byOrg, org)
	}
	s.mu.Unlock()
	s.running.Done()
}

// Crons claims and runs the cron ticks due on selfhost installations (SPEC 3.6), a pass every
// interval until ctx ends; every replica runs it, and each tick is claimed by one at most. The
// ticks a pass claims run concurrently, each recorded when its node answers; Crons returns once
// those still running have ended.
func (h *Host) Crons(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	slots := newTickSlots()
	defer slots.running.Wait()
	for {
		h.claimTicks(ctx, slots)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// claimTicks is one pass: ticks missed or braked are logged, the others run.
func (h *Host) claimTicks(ctx context.Context, slots *tickSlots) {
	var newer *store.SchemaNewer
	if err := store.CheckSchema(ctx, h.DB); errors.As(err, &newer) {
		return // the Janitor says so; an older replica claims no tick under newer rules
	}
	run, settled, err := h.Resources.ClaimTicks(ctx, h.DB, slots)
	if err != nil && ctx.Err() == nil {
		h.Log.Warn("could not claim the cron ticks due", "error", err.Error())
	}
	for _, s := range settled {
		attrs := []any{"worker_uid", s.WorkerUID, "organization", s.Organization, "space", s.Space, "worker", s.Name, "cron", s.Cron,
			"scheduled_for", s.ScheduledTime.UTC().Format(time.RFC3339)}
		if s.Outcome == dbsqlc.CronTickOutcomeMissed {
			h.Log.Warn("cron ticks missed: no Host ran cron ticks when they were due; they are not run", append(attrs, "missed", s.Missed)...)
		} else {
			h.Log.Info("cron tick not run: a deployment brake covers the worker", attrs...)
		}
		h.metrics.ticks.WithLabelValues(string(s.Outcome)).Add(float64(max(1, s.Missed)))
	}
	for _, t := range run {
		go func(t resource.Tick) {
			defer slots.Give(t.Organization) // taken by ClaimTicks
			outcome, detail := h.Resources.RunTick(ctx, h.DB, t)
			h.metrics.ticks.WithLabelValues(string(outcome)).Inc()
			if outcome == dbsqlc.CronTickOutcomeFailed {
				h.Log.Warn("a cron tick was not run", "worker_uid", t.WorkerUID, "organization", t.Organization, "space", t.Space,
					"worker", t.Name, "cron", t.Cron, "scheduled_for", t.ScheduledTime.UTC().Format(time.RFC3339), "detail", detail)
			}
		}(t)
	}
}

// CronPass claims the ticks due now and runs them, returning once their outcomes are recorded:
// one pass of Crons that waits for its ticks (tests drive replicas with it).
func (h *Host) CronPass(ctx context.Context) {
	slots := newTickSlots()
	h.claimTicks(ctx, slots)
	slots.running.Wait()
}

// maxDomainChecksPerPass bounds the custom-domain lookups one replica makes in a pass.
const maxDomainChecksPerPass = 32

// DomainChecks looks up the custom domains due for a check (SPEC 3.7), a pass every interval until
// ctx ends; every replica runs it, and each claim is looked up by one at a time.
func (h *Host) DomainChecks(ctx context.Context, every time.Duration) {
	if h.Domains.Available() != nil {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		for {
			n, err := h.Domains.CheckDue(ctx, h.DB, maxDomainChecksPerPass)
			if err != nil && ctx.Err() == nil {
				h.Log.Warn("custom domain checks", "error", err)
			}
			if n < maxDomainChecksPerPass || ctx.Err() != nil {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
