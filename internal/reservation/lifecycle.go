package reservation

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// WorkerIncarnation is a worker as the reservation authority sees it: proved Ready at its current
// generation by the caller, in the same transaction, with its active deployment's placement.
type WorkerIncarnation struct {
	OrganizationID string
	UID            uuid.UUID
	Revision       int64
	Space          string
	Name           string
	Placement      catalog.Placement
}

// EndpointWitness is an endpoint being created on a reservation: recorded as its witness.
type EndpointWitness struct {
	UID      uuid.UUID
	Revision int64
}

// EndpointIncarnation is an endpoint proved Ready at its current generation by the caller.
type EndpointIncarnation struct {
	UID             uuid.UUID
	Revision        int64
	WorkerUID       uuid.UUID
	CanonicalOrigin string
	Placement       catalog.Placement
}

func mustBeLive(r Reservation) error {
	switch {
	case r.Format != FormatV2:
		return apierr.New(apierr.ReservationMismatch, "reservation %q is a migrated %s row; it is readable and never written", r.ID, r.Format)
	case r.Live():
		return nil
	case r.Status == dbsqlc.ReservationStatusExpired:
		return apierr.New(apierr.ReservationNotLive, "reservation %q expired; reserve again with a new id (or a new reservation resource)", r.ID)
	default:
		return apierr.New(apierr.ReservationNotLive, "reservation %q is %s", r.ID, r.Status)
	}
}

// Bind binds the reservation to the exact worker incarnation w, or advances a binding to the same
// UID at an older revision, or takes over the binding of a worker that is provably gone; and, when
// e is set (an endpoint create), records e as the reservation's endpoint witness in the same
// compare-and-swap, clearing in place a previous witness that is provably gone (SPEC 3.3). The
// caller has proved w Ready in tx.
func (s *Service) Bind(ctx context.Context, tx pgx.Tx, id string, w WorkerIncarnation, e *EndpointWitness) (Reservation, error) {
	current, err := lock(ctx, tx, w.OrganizationID, id)
	if err != nil {
		return Reservation{}, err
	}
	if err := mustBeLive(current); err != nil {
		return Reservation{}, err
	}
	if current.Space != w.Space || current.WorkerName != w.Name {
		return Reservation{}, apierr.New(apierr.ReservationMismatch, "reservation %q is for worker %s/%s, not %s/%s", id, current.Space, current.WorkerName, w.Space, w.Name)
	}
	if current.Placement() != w.Placement {
		return Reservation{}, apierr.New(apierr.PlacementDrift, "reservation %q is placed on offering %s (digest %.12s) but the worker's active deployment is on %s (digest %.12s)",
			id, current.OfferingID, current.OfferingDigest, w.Placement.OfferingID, w.Placement.OfferingDigest)
	}
	sameWorker := current.BoundWorkerUID != nil && *current.BoundWorkerUID == w.UID
	if current.Status != dbsqlc.ReservationStatusPrepared && sameWorker && *current.BoundWorkerRevision >= w.Revision &&
		(e == nil || (current.EndpointUID != nil && *current.EndpointUID == e.UID && *current.EndpointRevision == e.Revision)) {
		return current, nil // already bound to this incarnation (and witnessed by this endpoint)
	}
	params := dbsqlc.ReservationBindParams{
		OrganizationID: w.OrganizationID, ID: id, WorkerUID: w.UID, WorkerRevision: w.Revision,
		Space: w.Space, WorkerName: w.Name, OfferingID: w.Placement.OfferingID, OfferingDigest: w.Placement.OfferingDigest,
		Pack: w.Placement.Pack, Installation: w.Placement.Installation,
	}
	if e != nil {
		params.EndpointUID, params.EndpointRevision = &e.UID, &e.Revision
	}
	row, err := dbsqlc.New(tx).ReservationBind(ctx, params)
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: bind: %w", err)
	}
	if row.WrittenRevision != 0 {
		return lock(ctx, tx, w.OrganizationID, id)
	}
	// Nothing written: name what stands in the way.
	if current.BoundWorkerUID != nil && !sameWorker {
		if b(row.WorkerPresent) {
			return Reservation{}, apierr.New(apierr.BoundElsewhere, "reservation %q is bound to another worker incarnation of %s/%s (uid %s) that still exists; delete it first, or use another reservation",
				id, w.Space, w.Name, current.BoundWorkerUID)
		}
		if unmet := unmetOf(map[string]bool{"attestation_open": b(row.WorkerAttestationOpen), "deployment_live": b(row.WorkerDeploymentLive), "lease_claimed": b(row.WorkerLeaseClaimed)}); len(unmet) > 0 {
			return Reservation{}, witnessOpen(id, "its previous worker (uid "+current.BoundWorkerUID.String()+") is deleted but not yet provably gone", unmet)
		}
	}
	if current.EndpointUID != nil && (e == nil || *current.EndpointUID != e.UID) {
		if b(row.WitnessPresent) {
			return Reservation{}, apierr.New(apierr.BoundElsewhere, "reservation %q already carries endpoint %s, which still exists; one reservation publishes one endpoint", id, current.EndpointUID)
		}
		if unmet := unmetOf(map[string]bool{"lease_claimed": b(row.WitnessLeaseClaimed), "attestation_open": b(row.WitnessAttestationOpen), "deployment_live": b(row.WitnessDeploymentLive)}); len(unmet) > 0 {
			return Reservation{}, witnessOpen(id, "its previous endpoint (uid "+current.EndpointUID.String()+") is deleted but its route may still answer", unmet)
		}
	}
	return Reservation{}, apierr.New(apierr.IntentInProgress, "reservation %q changed while binding; retry", id)
}

// unmetOf lists the fences that are set, in the order SPEC 3.3 names them.
func unmetOf(fences map[string]bool) []string {
	unmet := []string{}
	for _, name := range []string{"activation", "lease_claimed", "endpoint_present", "attestation_open", "deployment_live"} {
		if fences[name] {
			unmet = append(unmet, name)
		}
	}
	return unmet
}

func witnessOpen(id, why string, unmet []string) *apierr.Error {
	return apierr.New(apierr.WitnessOpen, "reservation %q keeps its origin until %s; retry shortly (unmet fences %v)", id, why, unmet).
		With("unmetFences", unmet)
}

// Activate moves a bound reservation to activated with the exact endpoint recorded as its
// witness (SPEC 3.3, activation). Replaying the same endpoint is idempotent.
func (s *Service) Activate(ctx context.Context, tx pgx.Tx, orgID, id string, e EndpointIncarnation) (Reservation, error) {
	current, err := lock(ctx, tx, orgID, id)
	if err != nil {
		return Reservation{}, err
	}
	if current.Status == dbsqlc.ReservationStatusActivated && current.EndpointUID != nil && *current.EndpointUID == e.UID {
		return current, nil
	}
	if err := mustBeLive(current); err != nil {
		return Reservation{}, err
	}
	switch {
	case current.Status == dbsqlc.ReservationStatusActivated:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "reservation %q is activated with another endpoint (uid %s); delete that activation first", id, current.EndpointUID)
	case current.Status != dbsqlc.ReservationStatusBound:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "reservation %q is %s; create the endpoint with this reservation first", id, current.Status)
	case current.EndpointUID == nil || *current.EndpointUID != e.UID:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "endpoint %s was not created on reservation %q; activate the endpoint that names it", e.UID, id)
	case *current.BoundWorkerUID != e.WorkerUID:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "the endpoint belongs to worker uid %s, but reservation %q is bound to %s", e.WorkerUID, id, current.BoundWorkerUID)
	case current.CanonicalOrigin != e.CanonicalOrigin:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "the endpoint serves %s, but reservation %q holds %s", e.CanonicalOrigin, id, current.CanonicalOrigin)
	case current.Pack != e.Placement.Pack || current.Installation != e.Placement.Installation:
		return Reservation{}, apierr.New(apierr.PlacementDrift, "the endpoint runs on %s/%s, but reservation %q is placed on %s/%s", e.Placement.Pack, e.Placement.Installation, id, current.Pack, current.Installation)
	}
	row, err := dbsqlc.New(tx).ReservationActivate(ctx, dbsqlc.ReservationActivateParams{
		OrganizationID: orgID, ID: id, EndpointUID: &e.UID, EndpointRevision: &e.Revision, WorkerUID: &e.WorkerUID,
		CanonicalOrigin: e.CanonicalOrigin, Pack: e.Placement.Pack, Installation: e.Placement.Installation,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return Reservation{}, apierr.New(apierr.IntentInProgress, "reservation %q changed while activating; retry", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: activate: %w", err)
	}
	return fromRow(row, ""), nil
}

// Deactivate moves an activated reservation back to bound, keeping the endpoint as the deletion
// witness. A reservation that is not activated is left as it is.
func (s *Service) Deactivate(ctx context.Context, tx pgx.Tx, orgID, id string) (Reservation, error) {
	current, err := lock(ctx, tx, orgID, id)
	if err != nil {
		return Reservation{}, err
	}
	if current.Status != dbsqlc.ReservationStatusActivated {
		return current, nil
	}
	if current.Format != FormatV2 {
		return Reservation{}, apierr.New(apierr.ReservationMismatch, "reservation %q is a migrated %s row; it is readable and never written", id, current.Format)
	}
	row, err := dbsqlc.New(tx).ReservationDeactivate(ctx, dbsqlc.ReservationDeactivateParams{OrganizationID: orgID, ID: id})
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: deactivate: %w", err)
	}
	return fromRow(row, ""), nil
}

// ClearWitness drops a witness that is provably gone (SPEC 3.4, letting go in place). It reports
// whether the witness was cleared; unmet fences refuse with witness_open.
func (s *Service) ClearWitness(ctx context.Context, tx pgx.Tx, orgID, id string) (bool, error) {
	f, err := dbsqlc.New(tx).ReservationClearWitness(ctx, dbsqlc.ReservationClearWitnessParams{OrganizationID: orgID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // nothing retained
	}
	if err != nil {
		return false, fmt.Errorf("reservation: clear witness: %w", err)
	}
	if f.Cleared {
		return true, nil
	}
	if b(f.EndpointPresent) {
		return false, apierr.New(apierr.BoundElsewhere, "reservation %q still carries an endpoint that exists; delete it first", id)
	}
	return false, witnessOpen(id, "its previous endpoint's route is provably gone",
		unmetOf(map[string]bool{"lease_claimed": b(f.LeaseClaimed), "attestation_open": b(f.AttestationOpen), "deployment_live": b(f.DeploymentLive)}))
}

func fenced(id string, activation, lease, present, attestation, deployment bool) *apierr.Error {
	unmet := unmetOf(map[string]bool{"activation": activation, "lease_claimed": lease, "endpoint_present": present, "attestation_open": attestation, "deployment_live": deployment})
	first := "wait for the endpoint's deletion to close"
	switch {
	case activation:
		first = "destroy the activation (takoform_worker_endpoint_activation) first, then the endpoint"
	case present:
		first = "destroy the endpoint (takoform_worker_endpoint) first"
	case lease:
		first = "wait for the runtime input's claim to settle or expire, or delete it"
	}
	return apierr.New(apierr.ReleaseFenced, "reservation %q cannot let go of its origin yet: unmet fences %v; %s", id, unmet, first).
		With("unmetFences", unmet)
}
