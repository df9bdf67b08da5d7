// Package runtimeref derives the plan-known identity of a runtime input (SPEC 3.5): its
// preparation id and reference, from the material-set nonce, the target and the binding values.
// It is pure, and shared by the Host, which recomputes and checks the reference, and the
// provider, which computes it at plan time.
package runtimeref

import (
	"crypto/sha256"
	"encoding/hex"
	"sort"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
)

// PreflightFormat names the canonical document the reference is a digest of.
const PreflightFormat = "takoserver.worker-runtime-input-preflight.v1"

// Target names where a runtime input goes. CanonicalPublicOrigin comes from the reservation.
type Target struct {
	Space                 string
	WorkerName            string
	BundleName            string
	EndpointName          string
	OriginReservationID   string
	CanonicalPublicOrigin string
}

// Identity is what the reference derivation yields.
type Identity struct {
	// Canonical is the preflight document the digest is taken over. It holds the values: never
	// store, log or return it.
	Canonical     []byte
	Digest        string
	PreparationID string
	Reference     string
}

// Derive computes the reference of SPEC 3.5: H = SHA-256 of the canonical preflight JSON (keys in
// exactly the given order, bindings sorted by name in code-unit order), preparationId = "prep-" +
// H[0:32], runtimeInputReference = "rip1." + preparationId + "." + H. The worker UID is not in it,
// so the reference is known at plan time.
func Derive(nonce string, t Target, bindings map[string]string) Identity {
	names := make([]string, 0, len(bindings))
	for n := range bindings {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return canonjson.LessUTF16(names[i], names[j]) })
	values := make(canonjson.Object, 0, len(names))
	for _, n := range names {
		values = append(values, canonjson.Field{Key: n, Value: bindings[n]})
	}
	canonical := canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: PreflightFormat},
		{Key: "materialSetNonce", Value: nonce},
		{Key: "target", Value: canonjson.Object{
			{Key: "space", Value: t.Space},
			{Key: "workerName", Value: t.WorkerName},
			{Key: "bundleName", Value: t.BundleName},
			{Key: "endpointName", Value: t.EndpointName},
			{Key: "originReservationId", Value: t.OriginReservationID},
			{Key: "canonicalPublicOrigin", Value: t.CanonicalPublicOrigin},
		}},
		{Key: "bindings", Value: values},
	})
	sum := sha256.Sum256(canonical)
	h := hex.EncodeToString(sum[:])
	prep := "prep-" + h[:32]
	return Identity{Canonical: canonical, Digest: h, PreparationID: prep, Reference: "rip1." + prep + "." + h}
}
