package backend

import (
	"context"
	"time"
)

// ObserveTimeout bounds one read of a native object, beyond the wait of a read held for a change.
const ObserveTimeout = 5 * time.Second

// Await reads a native object through m until done accepts the read (its observation, or the
// error reading it), deadline passes or ctx ends, and answers the last read. Where m can wait for
// a change (a ChangeObserver, with the last observation carrying a Version), each later read is
// held by the pack until the object changes; elsewhere the next read follows a pause of 25 ms,
// doubling up to 250 ms.
func Await(ctx context.Context, m Mutator, kind, native string, deadline time.Time, done func(Observation, error) bool) (Observation, error) {
	watcher, _ := m.(ChangeObserver)
	observe := func() (Observation, error) {
		ctx, cancel := context.WithTimeout(ctx, ObserveTimeout)
		defer cancel()
		return m.Observe(ctx, kind, native)
	}
	obs, err := observe()
	for pause := 25 * time.Millisecond; ; pause = min(2*pause, 250*time.Millisecond) {
		left := time.Until(deadline)
		if done(obs, err) || left <= 0 || ctx.Err() != nil {
			return obs, err
		}
		if watcher != nil && err == nil && obs.Version != "" {
			held, cancel := context.WithTimeout(ctx, left+ObserveTimeout)
			obs, err = watcher.ObserveChange(held, kind, native, obs, left)
			cancel()
			continue
		}
		if left < pause {
			return obs, err
		}
		select {
		case <-ctx.Done():
			return obs, err
		case <-time.After(pause):
		}
		obs, err = observe()
	}
}
