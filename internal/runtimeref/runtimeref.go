// Package runtimeref derives the plan-known identity of a runtime input (SPEC 3.5): its
// preparation id and reference, from the material-set nonce, the target and the binding values.
// It is pure, and shared by the Host, which recomputes and checks the reference, and the
// provider, which computes it at plan time.
//
// Two formats exist. rip1 (the seeds') digests the values themselves, so anyone holding a plan or
// a state can test guesses of a weak secret offline; it is still read and accepted for inputs that
// have it. rip2 digests each value's HMAC under a commitment key only a holder of a write key can
// get from the Host, so the reference in a plan says nothing testable about the values.
package runtimeref

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"sort"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
)

// PreflightFormat names the canonical document a rip1 reference is a digest of, PreflightFormatV2
// a rip2 one's, and CommitmentKeyFormat the document a commitment key is derived from.
const (
	PreflightFormat     = "takoserver.worker-runtime-input-preflight.v1"
	PreflightFormatV2   = "takoserver.worker-runtime-input-preflight.v2"
	CommitmentKeyFormat = "takoserver.runtime-input-commitment-key.v1"
)

// SecretIDPattern is the shape of a commitment secret's id, which a rip2 reference carries.
const SecretIDPattern = `c[0-9]{14}-[0-9a-f]{8}`

var (
	rip1Pattern = regexp.MustCompile(`^rip1\.(prep-[0-9a-f]{32})\.([0-9a-f]{64})$`)
	rip2Pattern = regexp.MustCompile(`^rip2\.(` + SecretIDPattern + `)\.(prep-[0-9a-f]{32})\.([0-9a-f]{64})$`)
)

// Parsed is a well-formed reference taken apart: its format (1 or 2), the commitment secret id
// (rip2 only) and the preparation id.
type Parsed struct {
	Version       int
	SecretID      string
	PreparationID string
}

// Parse takes a reference apart; ok is false for anything that is not a well-formed rip1 or rip2
// reference.
// The preparation id must be the digest's own prefix.
func Parse(reference string) (p Parsed, ok bool) {
	if m := rip2Pattern.FindStringSubmatch(reference); m != nil && strings.HasPrefix(m[3], m[2][len("prep-"):]) {
		return Parsed{Version: 2, SecretID: m[1], PreparationID: m[2]}, true
	}
	if m := rip1Pattern.FindStringSubmatch(reference); m != nil && strings.HasPrefix(m[2], m[1][len("prep-"):]) {
		return Parsed{Version: 1, PreparationID: m[1]}, true
	}
	return Parsed{}, false
}

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
	canonical := preflight(PreflightFormat, nonce, t, bindings, func(_, value string) string { return value })
	sum := sha256.Sum256(canonical)
	h := hex.EncodeToString(sum[:])
	prep := "prep-" + h[:32]
	return Identity{Canonical: canonical, Digest: h, PreparationID: prep, Reference: "rip1." + prep + "." + h}
}

// CommitmentKey is k of SPEC 3.5's rip2: HMAC-SHA256 under the Host's commitment secret of the
// canonical JSON {"format","org","materialSetNonce"}. Only the Host computes it; the provider
// asks for it, uses it and keeps it nowhere.
func CommitmentKey(secret []byte, org, nonce string) []byte {
	mac := hmac.New(sha256.New, secret)
	mac.Write(canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: CommitmentKeyFormat},
		{Key: "org", Value: org},
		{Key: "materialSetNonce", Value: nonce},
	}))
	return mac.Sum(nil)
}

// DeriveV2 computes a rip2 reference: the rip1 derivation over the v2 preflight document, each
// value replaced by the lowercase hex of HMAC-SHA256(key, canonical JSON {"name","value"}), and
// the commitment secret's id carried in the reference (rip2.<secret id>.<prep id>.<sha256>).
// Canonical holds no value, only their keyed digests; still, keep it nowhere.
func DeriveV2(key []byte, secretID, nonce string, t Target, bindings map[string]string) Identity {
	canonical := preflight(PreflightFormatV2, nonce, t, bindings, func(name, value string) string {
		mac := hmac.New(sha256.New, key)
		mac.Write(canonjson.Marshal(canonjson.Object{{Key: "name", Value: name}, {Key: "value", Value: value}}))
		return hex.EncodeToString(mac.Sum(nil))
	})
	sum := sha256.Sum256(canonical)
	h := hex.EncodeToString(sum[:])
	prep := "prep-" + h[:32]
	return Identity{Canonical: canonical, Digest: h, PreparationID: prep, Reference: "rip2." + secretID + "." + prep + "." + h}
}

// preflight is the canonical preflight document of a format, each binding's value as commit
// gives it (keys in exactly this order, bindings sorted by name in code-unit order).
func preflight(format, nonce string, t Target, bindings map[string]string, commit func(name, value string) string) []byte {
	names := make([]string, 0, len(bindings))
	for n := range bindings {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return canonjson.LessUTF16(names[i], names[j]) })
	values := make(canonjson.Object, 0, len(names))
	for _, n := range names {
		values = append(values, canonjson.Field{Key: n, Value: commit(n, bindings[n])})
	}
	return canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: format},
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
}
