// Package apierr is the one typed error the domain returns for a refusal the caller can act on.
// Each Code has exactly one HTTP status and title, mapped in one table by the server; domain code
// never names a status.
package apierr

import (
	"errors"
	"fmt"
)

// Error is a refusal with a stable machine code and a human detail. Extensions are extra
// problem members (for example unmetFences or conflict).
type Error struct {
	Code       Code
	Detail     string
	Extensions map[string]any
}

func (e *Error) Error() string { return string(e.Code) + ": " + e.Detail }

// Code is a stable machine-readable error code.
type Code string

// The codes. Keep the server's status table in step (a test checks it).
const (
	BadRequest        Code = "bad_request"
	InvalidRequest    Code = "invalid_request"
	Unauthenticated   Code = "unauthenticated"
	Forbidden         Code = "forbidden"
	NotFound          Code = "not_found"
	MethodNotAllowed  Code = "method_not_allowed"
	OwnershipConflict Code = "ownership_conflict"
	IntentInProgress  Code = "intent_in_progress"
	Tombstoned        Code = "tombstoned"
	OwnershipRequired Code = "ownership_token_required"
	BodyTooLarge      Code = "body_too_large"
	UnsupportedMedia  Code = "unsupported_media_type"
	OfferingAmbiguous Code = "offering_ambiguous"
	OfferingUnknown   Code = "offering_unknown"
	// LabelReserved: a chosen subdomain takes a shape the Host derives for some worker (SPEC 3.3).
	LabelReserved Code = "label_reserved"
	// LabelNotSold: the offering sells no chosen labels.
	LabelNotSold Code = "label_not_sold"
	// SubdomainNotDerivable: on workers-dev a worker's only label is its own script name.
	SubdomainNotDerivable Code = "subdomain_not_derivable"
	HostMintNamespace     Code = "hostmint_namespace"
	ReservationConflict   Code = "reservation_conflict"
	OriginTaken           Code = "origin_taken"
	ReservationMismatch   Code = "reservation_mismatch"
	ReleaseFenced         Code = "release_fenced"
	PlacementDrift        Code = "placement_drift"
	DeploymentBrake       Code = "deployment_brake"
	NotImplemented        Code = "not_implemented"
	BackendFailed         Code = "backend_failed"
	// BackendMisconfigured: the backend refused the installation's credentials or configuration;
	// only an operator fixes it, so the provider does not retry.
	BackendMisconfigured Code = "backend_misconfigured"
	DeploymentFailed     Code = "deployment_failed"
	BackendUnreachable   Code = "backend_unreachable"
	WorkerNotReady       Code = "worker_not_ready"
	WorkerHasEndpoints   Code = "worker_has_endpoints"
	EndpointActivated    Code = "endpoint_activated"
	ResourceExists       Code = "resource_exists"
	Immutable            Code = "immutable"
	BoundElsewhere       Code = "reservation_bound_elsewhere"
	ReservationNotLive   Code = "reservation_not_live"
	ActivationMismatch   Code = "activation_mismatch"
	ReferenceMismatch    Code = "reference_mismatch"
	TargetMismatch       Code = "target_mismatch"
	LeaseClaimed         Code = "lease_claimed"
	LeaseUnavailable     Code = "lease_unavailable"
	SealedMaterial       Code = "sealed_material_unreadable"
	RevisionConflict     Code = "revision_conflict"
	WitnessOpen          Code = "witness_open"
	ScriptHeld           Code = "script_held"
	QuotaExceeded        Code = "quota_exceeded"
	RateLimited          Code = "rate_limited"
	Conflict             Code = "conflict"
	Internal             Code = "internal"
	Unavailable          Code = "unavailable"

	// WorkerHasCallers: a live worker binds to this one (a service binding); delete its callers
	// first.
	WorkerHasCallers Code = "worker_has_callers"
	// LogsUnsupported: the worker's backend pack keeps no worker logs (the Cloudflare packs).
	LogsUnsupported Code = "logs_unsupported"
	// CronsUnsupported: the worker's offering runs no cron triggers (its cronDelivery is null).
	CronsUnsupported Code = "crons_unsupported"

	// DomainTaken: another organization verified this custom domain (SPEC 3.7; names nobody).
	DomainTaken Code = "domain_taken"
	// DomainReserved: the name is, or is under, one the operator reserves.
	DomainReserved Code = "domain_reserved"
	// DomainInUse: a reservation names this custom domain; release it first.
	DomainInUse Code = "domain_in_use"
	// DomainNotVerified: a reservation names a hostname no verified custom domain of the
	// organization covers.
	DomainNotVerified Code = "domain_not_verified"
	// CustomDomainUnsupported: the offering serves no custom domains.
	CustomDomainUnsupported Code = "custom_domain_unsupported"
)

// Retryable reports whether a refusal with code clears by itself, so that the caller should retry
// the same request after a pause (answered with Retry-After). A quota_exceeded does not: it
// clears only when the organization deletes something or an operator raises its ceiling.
func Retryable(code Code) bool {
	return code == IntentInProgress || code == WitnessOpen || code == Unavailable || code == BackendUnreachable || code == RateLimited
}

// New returns an *Error with a formatted detail.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Detail: fmt.Sprintf(format, args...)}
}

// With adds a problem member and returns e.
func (e *Error) With(key string, value any) *Error {
	if e.Extensions == nil {
		e.Extensions = map[string]any{}
	}
	e.Extensions[key] = value
	return e
}

// As returns the *Error in err's chain, if any.
func As(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// Is reports whether err's chain holds an *Error with code.
func Is(err error, code Code) bool {
	e, ok := As(err)
	return ok && e.Code == code
}
