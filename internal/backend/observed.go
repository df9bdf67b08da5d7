package backend

import (
	"context"
	"errors"
	"time"
)

// Seen is told of every call the Host makes to a backend's mutator: the installation, the call
// (apply, delete, observe), how long it took and its outcome (ok, unreachable, refused).
type Seen func(installation, call string, took time.Duration, outcome string)

// Outcome names a backend call's result for metrics: ok, unreachable (the backend could not be
// asked) or refused (it answered no).
func Outcome(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, ErrUnreachable):
		return "unreachable"
	}
	return "refused"
}

// observed reports each call of the mutator it wraps to seen. It forwards nothing else: the
// optional interfaces are found through Unwrap, and a ChangeObserver wraps as observedWatcher.
type observed struct {
	Mutator
	inst string
	seen Seen
}

func observe(m Mutator, inst string, seen Seen) Mutator {
	o := observed{Mutator: m, inst: inst, seen: seen}
	if w, ok := m.(ChangeObserver); ok {
		return observedWatcher{observed: o, watcher: w}
	}
	return o
}

func (o observed) Unwrap() Mutator { return o.Mutator }

func (o observed) Apply(ctx context.Context, d Desired) (Observation, error) {
	start := time.Now()
	obs, err := o.Mutator.Apply(ctx, d)
	o.seen(o.inst, "apply", time.Since(start), Outcome(err))
	return obs, err
}

func (o observed) Delete(ctx context.Context, d Desired) error {
	start := time.Now()
	err := o.Mutator.Delete(ctx, d)
	o.seen(o.inst, "delete", time.Since(start), Outcome(err))
	return err
}

func (o observed) Observe(ctx context.Context, kind, nativeName string) (Observation, error) {
	start := time.Now()
	obs, err := o.Mutator.Observe(ctx, kind, nativeName)
	o.seen(o.inst, "observe", time.Since(start), Outcome(err))
	return obs, err
}

// observedWatcher is observed for a mutator that can hold a read until a change. Those reads wait
// by design, so only their outcome is reported, not their time.
type observedWatcher struct {
	observed
	watcher ChangeObserver
}

func (o observedWatcher) ObserveChange(ctx context.Context, kind, nativeName string, since Observation, within time.Duration) (Observation, error) {
	obs, err := o.watcher.ObserveChange(ctx, kind, nativeName, since, within)
	o.seen(o.inst, "observe_change", 0, Outcome(err))
	return obs, err
}
