// Package desired is the runtime node's desired-state machine (SPEC 5): what each admin mutation
// (and each admission the node makes itself) does to the node's desired state, and which it refuses. Apply is a pure function of a
// state and one operation: no I/O, no clock (an operation carries its time), no locks, no workerd.
// The admin handlers decode a request, call Apply under the node's lock, persist the state it
// returns, then perform the side effects its Answer asks for.
//
// Apply never modifies the state it is given: the state it returns is its derivation
// (state.Desired.Derive), which shares every map and script it did not change, replaces those it
// did with copies, and names the entries it wrote for the save that follows.
package desired

import (
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// Op is one change of the desired state: one the admin API asks for (PutScript, DeleteScript,
// PutSecrets, DeleteSecrets, ConcludeAbsent, PutRoute, DeleteRoute, SetBrake), or one the node
// decides itself (Admit, AssignOrgUID).
type Op interface {
	apply(s *state.Desired) Answer
}

// Answer is what Apply decided: a refusal, a replay, or the change it made and the side effects
// the caller owes it, in this order: Seal before persisting the state; then Erase, DropLog,
// RetryFailed, Reconcile (waiting for what it retires when AwaitStop) and WakeAll.
type Answer struct {
	// Refused is why nothing changed, nil when the operation was accepted.
	Refused *Refusal
	// Replayed: the effect id was applied before with this very request; nothing changed, and the
	// caller answers as it did then.
	Replayed bool
	// Changed: the state returned differs from the one given, and must be persisted before any
	// side effect below. An accepted operation that changes nothing (the delete of what is absent
	// or another's) asks for nothing.
	Changed bool

	// Seal: the operation's secret values are sealed into their worker UID's file before the
	// state is persisted (the state names a delivery only once its values are at rest).
	Seal bool
	// Erase names the worker UID whose sealed delivery is erased once the state is persisted.
	Erase string
	// DropLog names the worker UID whose log ring goes (its script was deleted).
	DropLog string
	// RetryFailed: the script's failed candidate is asked again (a new effect asks anew).
	RetryFailed bool
	// Reconcile names the script whose incarnations move towards the new state.
	Reconcile string
	// AwaitStop: the answer waits until the incarnations the reconcile retires have stopped, so
	// that it is the truth about absence.
	AwaitStop bool
	// WakeAll: every held restart wakes and checks the brakes again.
	WakeAll bool
}

// Apply applies op to s and returns the state that results with the decision. A refused or
// replayed operation, or one that changes nothing, returns s itself.
func Apply(s state.Desired, op Op) (state.Desired, Answer) {
	next := s.Derive()
	a := op.apply(&next)
	if a.Refused != nil || a.Replayed || !a.Changed {
		return s, a
	}
	return next, a
}

func refused(r *Refusal) Answer { return Answer{Refused: r} }
