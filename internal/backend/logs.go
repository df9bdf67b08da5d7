package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// LogEntry is one entry of a worker's log: a line it printed (Level and Message), or a count of
// lines its backend's rate limit dropped (Dropped), or of entries that left the bounded buffer
// before this reader got to them (Missed).
type LogEntry struct {
	Time        time.Time
	Incarnation string
	Level       string
	Message     string
	Dropped     int
	Missed      int
}

// LogQuery says which of a worker's log entries to read.
type LogQuery struct {
	// Since, when set, skips entries received before it.
	Since time.Time
	// Follow keeps reading new entries as they arrive, until the context ends.
	Follow bool
}

// LogSource reads what a worker printed (SPEC 3.6: GET …/workers/{name}/logs). Its backend
// removes secret values before anything is kept, so no entry holds one.
type LogSource interface {
	// WorkerLogs calls each with the entries held for the worker (script scriptName, worker UID
	// workerUID) in order, then, with q.Follow, with each new one as it arrives, until ctx ends or
	// each fails. flush is called whenever no entry is pending, so the caller can pass on what
	// it has.
	WorkerLogs(ctx context.Context, scriptName string, workerUID uuid.UUID, q LogQuery, each func(LogEntry) error, flush func() error) error
}

// LogSource returns the log source of inst: only a runtime node keeps its workers' logs.
func (r *Registry) LogSource(inst catalog.Installation) (LogSource, error) {
	if inst.Pack != catalog.PackSelfhost {
		return nil, fmt.Errorf("%w (pack %s does not offer worker logs)", ErrNotImplemented, inst.Pack)
	}
	m, err := r.Mutator(inst)
	if err != nil {
		return nil, err
	}
	src, ok := As[LogSource](m)
	if !ok {
		return nil, fmt.Errorf("%w (pack %s does not offer worker logs)", ErrNotImplemented, inst.Pack)
	}
	return src, nil
}
