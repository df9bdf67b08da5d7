package runtime

import (
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
)

// Processes is what the node asks of whatever runs its incarnations. On a real node that is
// orgproc's Manager (sandboxed workerd, one process per organization); the admin API's tests give
// the node one that runs no code (runtimetest.Processes), so the handlers, the reconciler and the
// ledger they keep are tested without workerd.
type Processes interface {
	// Start places one incarnation; it reports its state changes through the hook it was made
	// with.
	Start(orgproc.Spec) (Incarnation, error)
	// WakeAll makes held restarts and reloads look at the lifecycle brakes again.
	WakeAll()
	// Close stops every process.
	Close()
}

// Incarnation is one started script identity, as the node sees it.
type Incarnation interface {
	ID() string
	Script() string
	// Ready mirrors Status().State == ready; Target is where the edge sends its requests (nil
	// when there is none).
	Ready() bool
	Status() orgproc.Status
	Target() edge.Target
	// Admit marks it as having served: after a restart it reloads unprobed.
	Admit()
	InFlight() int64
	SetWallLimit(time.Duration)
	SetCallees(map[string]string)
	// Drain stops it once its requests in flight finish (bounded by timeout), Stop at once; Done
	// is closed once it has left its process.
	Drain(timeout time.Duration)
	Stop()
	Done() <-chan struct{}
}

// NewProcesses makes a node's Processes; changed is to be called with a script's name whenever
// one of its incarnations changes state.
type NewProcesses func(changed func(script string)) (Processes, error)

// orgProcesses is orgproc's Manager as the node's Processes.
type orgProcesses struct{ *orgproc.Manager }

func (p orgProcesses) Start(spec orgproc.Spec) (Incarnation, error) {
	inc, err := p.Manager.Start(spec)
	if err != nil {
		return nil, err // not a typed nil inside the interface
	}
	return inc, nil
}
