// Package runtimeinput is the runtime-input authority (SPEC 3.5): preparations that seal secret
// bindings under a plan-known reference, and the one-shot lease that hands them to the backend.
package runtimeinput

import (
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// PreparationFormat is the format of a preparation request body.
const PreparationFormat = "takoserver.worker-runtime-input-preparation@v1"

// Target names where a runtime input goes (see runtimeref.Target).
type Target = runtimeref.Target

// Derive computes the reference of SPEC 3.5 over secret bindings (see runtimeref.Derive).
func Derive(nonce string, t Target, bindings map[string]vocab.Secret) runtimeref.Identity {
	plain := make(map[string]string, len(bindings))
	for k, v := range bindings {
		plain[k] = v.Reveal()
	}
	return runtimeref.Derive(nonce, t, plain)
}
