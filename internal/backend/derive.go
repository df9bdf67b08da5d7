package backend

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
)

// WorkerRef identifies a worker for the derivations: its organization's immutable id (tenantRef),
// space and name, and, where it exists, its UID.
type WorkerRef struct {
	TenantRef string
	Space     string
	Name      string
	UID       string
}

func digestHex(obj canonjson.Object) string {
	sum := sha256.Sum256(canonjson.Marshal(obj))
	return hex.EncodeToString(sum[:])
}

// DerivedProviderResourceName is SPEC 3.4's derivedProviderResourceName(prefix, {tenantRef, space, name}).
func DerivedProviderResourceName(prefix string, w WorkerRef) string {
	h := digestHex(canonjson.Object{
		{Key: "format", Value: "takoform.derived-provider-resource-name.v1"},
		{Key: "prefix", Value: prefix},
		{Key: "tenantRef", Value: w.TenantRef},
		{Key: "space", Value: w.Space},
		{Key: "name", Value: w.Name},
	})
	return prefix + "-" + h[:24]
}

var nonAlnum = regexp.MustCompile(`[^a-z0-9]+`)

func sanitize(s string) string {
	return strings.Trim(nonAlnum.ReplaceAllString(strings.ToLower(s), "-"), "-")
}

// ScriptName is the worker script name of SPEC 3.4 (v2): a readable part (worker, then space, cut
// to 30 characters) and 32 hex (128 bits) of a digest over the tenant, space and name. At most 63
// characters: a DNS label and a Cloudflare script name. Uniqueness per script namespace is not left
// to the hash: the database holds it with a unique index over live workers.
func ScriptName(w WorkerRef) string {
	return readablePart(w, 30) + "-" + workerDigest("takoform.worker-script-name.v2", w)[:32]
}

// ScriptNameV1 is the retired v1 derivation (54 readable characters and 32 bits of hash), kept for
// the vectors and for workers deployed under it, which keep their name until they are replaced.
// No new worker gets one: two organizations' workers can share a v1 name (SPEC 3.4).
func ScriptNameV1(w WorkerRef) string {
	return readablePart(w, 54) + "-" + workerDigest("takoform.worker-script-name.v1", w)[:8]
}

func readablePart(w WorkerRef, limit int) string {
	readable := sanitize(sanitize(w.Name) + "-" + sanitize(w.Space))
	if len(readable) > limit {
		readable = strings.Trim(readable[:limit], "-")
	}
	if readable == "" {
		readable = "w"
	}
	return readable
}

func workerDigest(format string, w WorkerRef) string {
	return digestHex(canonjson.Object{
		{Key: "format", Value: format},
		{Key: "tenantRef", Value: w.TenantRef},
		{Key: "space", Value: w.Space},
		{Key: "name", Value: w.Name},
	})
}

// HostMintedPrefix starts every id the Host mints; public writes to it are refused.
const HostMintedPrefix = "hostmint-"

// HostMintedReservationID is the id of the reservation the Host mints for one worker incarnation.
func HostMintedReservationID(w WorkerRef) string {
	h := digestHex(canonjson.Object{
		{Key: "format", Value: "takoserver.host-minted-reservation.v1"},
		{Key: "tenantRef", Value: w.TenantRef},
		{Key: "space", Value: w.Space},
		{Key: "workerName", Value: w.Name},
		{Key: "workerUid", Value: w.UID},
	})
	return HostMintedPrefix + h[:40]
}
