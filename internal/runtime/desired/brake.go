package desired

import (
	"slices"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// SetBrake engages or releases the lifecycle brake of exactly one scope (POST /v1/brakes/lifecycle).
// The brakes are a set: engaging an engaged scope, or releasing one that is not, changes nothing.
type SetBrake struct {
	Scope   adminapi.BrakeScope
	Engaged bool
}

func (op SetBrake) apply(s *state.Desired) Answer {
	if slices.Contains(s.Brakes, op.Scope) == op.Engaged {
		return Answer{}
	}
	brakes := slices.DeleteFunc(slices.Clone(s.Brakes), func(b adminapi.BrakeScope) bool { return b == op.Scope })
	if op.Engaged {
		brakes = append(brakes, op.Scope)
	}
	s.Brakes = brakes
	// Releasing wakes every held restart, which then checks the remaining brakes.
	return Answer{Changed: true, WakeAll: true}
}
