// Package resource is the authority over workers and endpoints (SPEC 3.6): their rows, their
// backend deployments, deletion attestations, and readiness derived from the deployment rows on
// every read. Every mutation runs inside an ownership.Mutation as a few named phases, each one
// transaction or one backend call, never both, and records its backend effects in the operation
// ledger (planned -> dispatched -> succeeded | failed). The phase runner of a put's or a delete's
// backend effects is effects (phases.go); the deployment and effect primitives it uses, with the
// liveness reads, are in deploy.go; crash recovery is in recovery.go; the attestation and operation
// reads are in reads.go.
package resource

import (
	"errors"
	"strings"
	"time"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Ownership kinds and provider resource types. An ownership kind is also the resource kind the
// deployments and deletion attestations record (dbsqlc.ResourceKind): one name each.
const (
	WorkerKind           = string(dbsqlc.ResourceKindWorker)
	WorkerResourceType   = "takoform_worker"
	EndpointKind         = string(dbsqlc.ResourceKindWorkerEndpoint)
	EndpointResourceType = "takoform_worker_endpoint"
)

// BackendCallTimeout bounds one backend call, admission wait included, inside an ownership lease
// (renewed while the call runs), so that a call cannot outlive the request that made it.
const BackendCallTimeout = 45 * time.Second

// Placement is where a resource runs (see catalog.Placement).
type Placement = catalog.Placement

// Service changes workers and endpoints.
type Service struct {
	Catalog       *catalog.Catalog
	Backends      *backend.Registry
	Reservations  *reservation.Service
	RuntimeInputs *runtimeinput.Service
	// Hooks stop a runtime-input consumption at a precise point (tests only).
	Hooks runtimeinput.Hooks
}

// Condition is one entry of a resource's conditions (the document's Condition).
type Condition = apitypes.Condition

// selectOffering resolves the offering a request names (or the only eligible one).
func (s *Service) selectOffering(org auth.Organization, kind string, id *string) (catalog.Offering, catalog.Installation, error) {
	want := ""
	if id != nil {
		want = *id
	}
	o, inst, err := s.Catalog.Select(catalog.Organization{ID: org.ID, Name: org.Name}, kind, want)
	switch {
	case errors.Is(err, catalog.ErrOfferingAmbiguous):
		return o, inst, apierr.New(apierr.OfferingAmbiguous, "%s", strings.TrimPrefix(err.Error(), "offering_ambiguous: "))
	case errors.Is(err, catalog.ErrOfferingUnknown):
		return o, inst, apierr.New(apierr.OfferingUnknown, "%s", strings.TrimPrefix(err.Error(), "offering_unknown: "))
	}
	return o, inst, err
}
