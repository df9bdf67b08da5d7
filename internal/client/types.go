package client

import "github.com/takoform/terraform-provider-takoform/api/apitypes"

// The wire types are the ones generated from api/openapi.yaml (api/apitypes), which the Host's
// projections use too; the client names them here so the provider reads client.Worker.
type (
	// Capabilities is GET /v1/capabilities. OrganizationID is the API key's organization (empty
	// from a Host that predates it).
	Capabilities = apitypes.Capabilities
	// Offering is one entry of GET /v1/offerings; Ceilings bound a module-worker's limits (nil on
	// other kinds).
	Offering         = apitypes.Offering
	OfferingCeilings = apitypes.OfferingCeilings
	// ObjectRef is a {uid, revision} pair.
	ObjectRef          = apitypes.ObjectRef
	ReservationRequest = apitypes.ReservationRequest
	Reservation        = apitypes.Reservation
	ActivationRequest  = apitypes.ActivationRequest
	DerivationRequest  = apitypes.DerivationRequest
	// CommitmentKey is the answer of POST /v1/runtime-input-commitment-keys: a key to compute a
	// rip2 reference with, and to keep nowhere.
	CommitmentKey        = apitypes.CommitmentKey
	CommitmentKeyRequest = apitypes.CommitmentKeyRequest
	// Derivation is what a reservation would hold; HeldBy is who holds an origin that is not
	// available: the caller's own reservation or endpoint by name, or another organization
	// ("other") and nothing more.
	Derivation = apitypes.Derivation
	Holder     = apitypes.Holder
	WorkerSpec = apitypes.WorkerSpec
	// WorkerLimits is a worker's own bounds; 0 is the offering's ceiling.
	WorkerLimits = apitypes.WorkerLimits
	Condition    = apitypes.Condition
	// RuntimeInputs is a worker's runtime input: reference and lease status, never values.
	RuntimeInputs = apitypes.RuntimeInputs
	Worker        = apitypes.Worker
	EndpointSpec  = apitypes.EndpointSpec
	WorkerRef     = apitypes.WorkerRef
	Endpoint      = apitypes.Endpoint
	// PreparationTarget is where a runtime input goes, as a caller names it.
	PreparationTarget = apitypes.PreparationTarget
	// PreparationRequest is the body of a preparation PUT. Bindings holds secret values: it is
	// sent once and never logged.
	PreparationRequest = apitypes.PreparationRequest
	// PreparationTargetView is a preparation's target with the origin the Host took from the
	// reservation.
	PreparationTargetView = apitypes.PreparationTargetView
	// Preparation is a runtime input's projection: names, never values.
	Preparation = apitypes.Preparation
	Attestation = apitypes.Attestation
	// CustomDomain is a custom domain claim: its status and the DNS records to publish.
	CustomDomain    = apitypes.CustomDomain
	DNSRecord       = apitypes.DNSRecord
	DomainCondition = apitypes.DomainCondition
)

// PreparationFormat is the format of a preparation PUT body.
const PreparationFormat = "takoserver.worker-runtime-input-preparation@v1"
