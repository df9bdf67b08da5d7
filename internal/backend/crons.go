package backend

import (
	"context"
	"time"
)

// Tick is one cron tick the Host claimed, to be run on a backend that runs ticks itself.
type Tick struct {
	ID            string
	ScriptName    string
	WorkerUID     string
	Cron          string
	ScheduledTime time.Time
	// Deadline: past it the backend refuses the tick, and the Host asks no more.
	Deadline time.Time
}

// TickOutcome is what became of a tick a backend ran: ok, or an exception (Detail says no more
// than that: the handler's text stays in the worker's log).
type TickOutcome struct {
	OK     bool
	Detail string
}

// CronRunner is a Mutator whose backend runs the cron ticks the Host claims (a runtime node,
// SPEC 3.6): each tick id at most once, before its deadline.
type CronRunner interface {
	RunTick(ctx context.Context, t Tick) (TickOutcome, error)
}
