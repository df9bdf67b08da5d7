package desired

import (
	"fmt"
	"sort"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// MaxEffects bounds the remembered effect ids; the oldest are forgotten first.
const MaxEffects = 10000

// Effect identifies one mutation of the Host (SPEC 5: every mutation is idempotent by its effect
// id): the id, a keyed digest of its request (the node's MAC: no reusable digest of a secret the
// body carries), and when it arrived.
type Effect struct {
	ID         string
	RequestMAC string
	// PreviousMAC is the request's digest under the node's previous sealing key, while it has one
	// (a rotation): an effect recorded before the rotation is still recognised as a replay.
	PreviousMAC string
	At          time.Time
}

// replay recognises an effect id: the same request on the same target again is a replay (true);
// the id on another target or with another request is refused.
func replay(s *state.Desired, e Effect, target string) (bool, *Refusal) {
	seen, ok := s.Effects[e.ID]
	if !ok {
		return false, nil
	}
	if seen.Target == target && (seen.RequestMAC == e.RequestMAC || (e.PreviousMAC != "" && seen.RequestMAC == e.PreviousMAC)) {
		return true, nil
	}
	return false, refusal(adminapi.CodeEffectConflict, ShowsNothing, "effect %s was already applied with another request", e.ID)
}

// record remembers an applied effect in a copy of the effect map, forgetting the oldest (by
// arrival, then id) beyond MaxEffects.
func record(s *state.Desired, e Effect, target string) {
	s.Effects = cloneMap(s.Effects)
	s.Effects[e.ID] = state.EffectEntry{Target: target, RequestMAC: e.RequestMAC, At: e.At.UTC()}
	if len(s.Effects) <= MaxEffects {
		return
	}
	ids := make([]string, 0, len(s.Effects))
	for id := range s.Effects {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool {
		a, b := s.Effects[ids[i]].At, s.Effects[ids[j]].At
		if !a.Equal(b) {
			return a.Before(b)
		}
		return ids[i] < ids[j]
	})
	for _, id := range ids[:len(ids)-MaxEffects] {
		delete(s.Effects, id)
	}
}

func target(kind, name string) string { return fmt.Sprintf("%s:%s", kind, name) }
