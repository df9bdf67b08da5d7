package desired

import (
	"fmt"
	"sort"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// MaxEffects bounds the remembered effect ids; the oldest are forgotten first, down to
// keptEffects.
const (
	MaxEffects  = 10000
	keptEffects = MaxEffects - MaxEffects/10
)

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

// record remembers an applied effect, forgetting the oldest (by arrival, then id) once there are
// more than MaxEffects: down to keptEffects at once, so that the sort is paid once per thousand
// effects, not on every one.
func record(s *state.Desired, e Effect, target string) {
	s.SetEffect(e.ID, state.EffectEntry{Target: target, RequestMAC: e.RequestMAC, At: e.At.UTC()})
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
	for _, id := range ids[:len(ids)-keptEffects] {
		s.DeleteEffect(id)
	}
}

func target(kind, name string) string { return fmt.Sprintf("%s:%s", kind, name) }
