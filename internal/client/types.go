package client

// The wire types of api/openapi.yaml, one Go type per schema (TestTypesMatchTheDocument checks the
// json names against the document's properties).

// Capabilities is GET /v1/capabilities (schema Capabilities). OrganizationID is the API key's
// organization (empty from a Host that predates it).
type Capabilities struct {
	Ownership           []string `json:"ownership"`
	ReservationFormats  []string `json:"reservationFormats"`
	RuntimeInputFormats []string `json:"runtimeInputFormats"`
	Packs               []string `json:"packs"`
	OrganizationID      string   `json:"organizationId,omitempty"`
}

// Offering is one entry of GET /v1/offerings (schema Offering).
type Offering struct {
	ID           string `json:"id"`
	Kind         string `json:"kind"`
	Pack         string `json:"pack"`
	Installation string `json:"installation"`
	Digest       string `json:"digest"`
	// Ceilings bound a module-worker's limits (nil on other kinds).
	Ceilings *OfferingCeilings `json:"ceilings,omitempty"`
}

// OfferingCeilings is an offering's ceilings (schema Offering.ceilings).
type OfferingCeilings struct {
	CPUMs       int64 `json:"cpuMs"`
	MemoryMB    int64 `json:"memoryMb"`
	FixedMemory bool  `json:"fixedMemory"`
}

// ObjectRef is a {uid, revision} pair (schema ObjectRef).
type ObjectRef struct {
	UID      string `json:"uid"`
	Revision int64  `json:"revision"`
}

// ReservationRequest is the body of a reservation PUT (schema ReservationRequest).
type ReservationRequest struct {
	Space      string  `json:"space"`
	WorkerName string  `json:"workerName"`
	Subdomain  *string `json:"subdomain,omitempty"`
	TTLSeconds *int64  `json:"ttlSeconds,omitempty"`
	OfferingID *string `json:"offeringId,omitempty"`
}

// Reservation is a reservation's projection (schema Reservation).
type Reservation struct {
	Format          string     `json:"format"`
	ID              string     `json:"id"`
	Space           string     `json:"space"`
	WorkerName      string     `json:"workerName"`
	Subdomain       string     `json:"subdomain"`
	CanonicalOrigin string     `json:"canonicalOrigin"`
	Revision        int64      `json:"revision"`
	ExpiresAt       string     `json:"expiresAt"`
	Status          string     `json:"status"`
	HostMinted      bool       `json:"hostMinted"`
	BoundWorker     *ObjectRef `json:"boundWorker"`
	Endpoint        *ObjectRef `json:"endpoint"`
	OwnershipToken  *string    `json:"ownershipToken"`
}

// ActivationRequest is the body of an activation PUT (schema ActivationRequest).
type ActivationRequest struct {
	EndpointUID string `json:"endpointUid"`
}

// DerivationRequest is the body of POST /v1/worker-endpoint-origin-derivations.
type DerivationRequest struct {
	Space               string  `json:"space"`
	WorkerName          string  `json:"workerName"`
	Subdomain           *string `json:"subdomain,omitempty"`
	OfferingID          *string `json:"offeringId,omitempty"`
	OriginReservationID *string `json:"originReservationId,omitempty"`
}

// Derivation is what a reservation would hold (schema Derivation).
type Derivation struct {
	OfferingID          string  `json:"offeringId"`
	CanonicalOrigin     string  `json:"canonicalOrigin"`
	Subdomain           string  `json:"subdomain"`
	HostMintedSubdomain *string `json:"hostMintedSubdomain"`
	Available           bool    `json:"available"`
	HeldBy              *Holder `json:"heldBy,omitempty"`
}

// Holder is who holds an origin that is not available (schema Derivation.heldBy): the caller's own
// reservation or endpoint by name, or another organization ("other") and nothing more.
type Holder struct {
	Organization string `json:"organization"`
	Kind         string `json:"kind,omitempty"`
	Name         string `json:"name,omitempty"`
}

// WorkerSpec is the body of a worker PUT (schema WorkerSpec).
type WorkerSpec struct {
	Modules               map[string]string `json:"modules"`
	MainModule            string            `json:"mainModule"`
	CompatibilityDate     string            `json:"compatibilityDate"`
	RequiredSensitiveVars []string          `json:"requiredSensitiveVars"`
	RuntimeInputReference *string           `json:"runtimeInputReference,omitempty"`
	OfferingID            *string           `json:"offeringId,omitempty"`
	Vars                  map[string]string `json:"vars,omitempty"`
	JSONVars              map[string]string `json:"jsonVars,omitempty"`
	CompatibilityFlags    []string          `json:"compatibilityFlags,omitempty"`
	ServiceBindings       map[string]string `json:"serviceBindings,omitempty"`
	Limits                *WorkerLimits     `json:"limits,omitempty"`
}

// WorkerLimits is a worker's own bounds (schema WorkerLimits); 0 is the offering's ceiling.
type WorkerLimits struct {
	CPUMs    int64 `json:"cpuMs,omitempty"`
	MemoryMB int64 `json:"memoryMb,omitempty"`
}

// Condition is one entry of conditions (schema Condition).
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// RuntimeInputs is a worker's runtime input: reference and lease status, never values.
type RuntimeInputs struct {
	Reference string `json:"reference"`
	Status    string `json:"status"`
}

// Worker is a worker's projection (schema Worker).
type Worker struct {
	UID                   string            `json:"uid"`
	Space                 string            `json:"space"`
	Name                  string            `json:"name"`
	Generation            int64             `json:"generation"`
	Revision              int64             `json:"revision"`
	Ready                 bool              `json:"ready"`
	Conditions            []Condition       `json:"conditions"`
	ScriptName            string            `json:"scriptName"`
	RuntimeInputs         *RuntimeInputs    `json:"runtimeInputs"`
	OwnershipToken        *string           `json:"ownershipToken"`
	Modules               map[string]string `json:"modules"`
	MainModule            string            `json:"mainModule"`
	CompatibilityDate     string            `json:"compatibilityDate"`
	Vars                  map[string]string `json:"vars"`
	JSONVars              map[string]string `json:"jsonVars"`
	CompatibilityFlags    []string          `json:"compatibilityFlags"`
	ServiceBindings       map[string]string `json:"serviceBindings"`
	Limits                *WorkerLimits     `json:"limits"`
	RequiredSensitiveVars []string          `json:"requiredSensitiveVars"`
	OfferingID            string            `json:"offeringId"`
}

// EndpointSpec is the body of an endpoint PUT (schema EndpointSpec).
type EndpointSpec struct {
	Worker              string  `json:"worker"`
	OriginReservationID *string `json:"originReservationId,omitempty"`
	OfferingID          *string `json:"offeringId,omitempty"`
}

// WorkerRef names an endpoint's worker.
type WorkerRef struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
}

// Endpoint is an endpoint's projection (schema Endpoint).
type Endpoint struct {
	UID                 string      `json:"uid"`
	Space               string      `json:"space"`
	Name                string      `json:"name"`
	Generation          int64       `json:"generation"`
	Revision            int64       `json:"revision"`
	Worker              WorkerRef   `json:"worker"`
	OriginReservationID string      `json:"originReservationId"`
	HostMinted          bool        `json:"hostMinted"`
	Hostname            string      `json:"hostname"`
	URL                 string      `json:"url"`
	Ready               bool        `json:"ready"`
	Conditions          []Condition `json:"conditions"`
	OfferingID          string      `json:"offeringId"`
	OwnershipToken      *string     `json:"ownershipToken"`
}

// PreparationTarget is where a runtime input goes, as a caller names it.
type PreparationTarget struct {
	Space               string `json:"space"`
	WorkerName          string `json:"workerName"`
	BundleName          string `json:"bundleName"`
	EndpointName        string `json:"endpointName"`
	OriginReservationID string `json:"originReservationId"`
}

// PreparationRequest is the body of a preparation PUT (schema PreparationRequest). Bindings
// holds secret values: it is sent once and never logged.
type PreparationRequest struct {
	Format                string            `json:"format"`
	MaterialSetNonce      string            `json:"materialSetNonce"`
	RuntimeInputReference string            `json:"runtimeInputReference"`
	Target                PreparationTarget `json:"target"`
	Bindings              map[string]string `json:"bindings"`
}

// PreparationFormat is the format of a preparation PUT body.
const PreparationFormat = "takoserver.worker-runtime-input-preparation@v1"

// PreparationTargetView is a preparation's target with the origin the Host took from the
// reservation.
type PreparationTargetView struct {
	Space                 string `json:"space"`
	WorkerName            string `json:"workerName"`
	BundleName            string `json:"bundleName"`
	EndpointName          string `json:"endpointName"`
	OriginReservationID   string `json:"originReservationId"`
	CanonicalPublicOrigin string `json:"canonicalPublicOrigin"`
}

// Preparation is a runtime input's projection (schema Preparation): names, never values.
type Preparation struct {
	Format                string                `json:"format"`
	OperationID           string                `json:"operationId"`
	PreparationID         string                `json:"preparationId"`
	RuntimeInputReference string                `json:"runtimeInputReference"`
	MaterialSetNonce      string                `json:"materialSetNonce"`
	Target                PreparationTargetView `json:"target"`
	BindingNames          []string              `json:"bindingNames"`
	Status                string                `json:"status"`
	ExpiresAt             string                `json:"expiresAt"`
	BoundWorker           *ObjectRef            `json:"boundWorker"`
	Failure               *string               `json:"failure"`
	OwnershipToken        *string               `json:"ownershipToken"`
}

// Attestation is a deletion attestation (schema Attestation).
type Attestation struct {
	UID          string  `json:"uid"`
	ResourceKind string  `json:"resourceKind"`
	Status       string  `json:"status"`
	OperationID  *string `json:"operationId"`
	OpenedAt     string  `json:"openedAt"`
	ClosedAt     *string `json:"closedAt"`
}
