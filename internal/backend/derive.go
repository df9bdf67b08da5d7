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

// ScriptName is the worker script name of SPEC 3.4: a readable part (worker, then space) and the
// first 8 hex of a digest that makes it unique per tenant.
func ScriptName(w WorkerRef) string {
	readable := sanitize(sanitize(w.Name) + "-" + sanitize(w.Space))
	if len(readable) > 54 {
		readable = strings.Trim(readable[:54], "-")
	}
	if readable == "" {
		readable = "w"
	}
	h := digestHex(canonjson.Object{
		{Key: "format", Value: "takoform.worker-script-name.v1"},
		{Key: "tenantRef", Value: w.TenantRef},
		{Key: "space", Value: w.Space},
		{Key: "name", Value: w.Name},
	})
	return readable + "-" + h[:8]
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
