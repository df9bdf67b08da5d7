package backend

import (
	"errors"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// LateWritesUnfenced reports whether a pack's uploads can land after the Host read the object
// back absent, with nothing on the backend to refuse them (SPEC 8). A runtime node fences a late
// admin call with its generation floors; Cloudflare has no conditional upload, so a call that got
// no answer, or that a stopped Host sent, may still land for as long as Cloudflare works on it.
// On such a pack one read of absence is not final: the Host re-checks the script once that call
// could have ended (resource's late-write re-checks).
func LateWritesUnfenced(pack string) bool {
	return pack == catalog.PackWorkersDev || pack == catalog.PackWFPManaged
}

// MayLandLate reports whether a failed apply may still land later: true unless the backend gave
// a definite answer that it did not take it (a refusal, a script held by another worker, a
// misconfiguration, a rate-limit answer). No answer at all (unreachable, a deadline) may land.
func MayLandLate(err error) bool {
	if err == nil {
		return false
	}
	var refused *RefusedError
	var limited *RateLimitedError
	switch {
	case errors.As(err, &refused), errors.As(err, &limited),
		errors.Is(err, ErrScriptHeld), errors.Is(err, ErrMisconfigured), errors.Is(err, ErrPlacementDrift), errors.Is(err, ErrNotImplemented):
		return false
	}
	return true
}
