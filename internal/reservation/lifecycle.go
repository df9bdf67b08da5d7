package reservation

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// Placement returns where the reservation was placed.
func (r Reservation) Placement() catalog.Placement {
	return catalog.Placement{OfferingID: r.OfferingID, OfferingDigest: r.OfferingDigest, Pack: r.Pack, Installation: r.Installation}
}

// Live reports whether the row holds its origin as a live reservation.
func (r Reservation) Live() bool {
	return r.Status == "prepared" || r.Status == "bound" || r.Status == "activated"
}

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
	case r.Live():
		return nil
	case r.Status == "expired":
		return apierr.New(apierr.ReservationNotLive, "reservation %q expired; reserve again with a new id (or a new reservation resource)", r.ID)
	default:
		return apierr.New(apierr.ReservationNotLive, "reservation %q is %s", r.ID, r.Status)
	}
}

// Bind binds the reservation to the exact worker incarnation, or advances a binding to the same
// UID at an older revision (SPEC 3.3, bind). The caller has proved w Ready in tx.
func (s *Service) Bind(ctx context.Context, tx pgx.Tx, id string, w WorkerIncarnation) (Reservation, error) {
	current, err := get(ctx, tx, w.OrganizationID, id)
	if err != nil {
		return Reservation{}, err
	}
	if err := mustBeLive(current); err != nil {
		return Reservation{}, err
	}
	if current.Space != w.Space || current.WorkerName != w.Name {
		return Reservation{}, apierr.New(apierr.ReservationMismatch, "reservation %q is for worker %s/%s, not %s/%s", id, current.Space, current.WorkerName, w.Space, w.Name)
	}
	if current.BoundWorkerUID != nil && *current.BoundWorkerUID != w.UID {
		return Reservation{}, apierr.New(apierr.BoundElsewhere, "reservation %q is bound to another incarnation of worker %s/%s (uid %s)", id, w.Space, w.Name, current.BoundWorkerUID)
	}
	if current.Placement() != w.Placement {
		return Reservation{}, apierr.New(apierr.PlacementDrift, "reservation %q is placed on offering %s (digest %.12s) but the worker's active deployment is on %s (digest %.12s)",
			id, current.OfferingID, current.OfferingDigest, w.Placement.OfferingID, w.Placement.OfferingDigest)
	}
	if current.BoundWorkerUID != nil && *current.BoundWorkerRevision >= w.Revision {
		return current, nil // already bound to this incarnation at this (or a later) revision
	}
	r, err := scan(tx.QueryRow(ctx, store.Q("ReservationBindWorker"), pgx.NamedArgs{
		"organization_id": w.OrganizationID, "id": id, "worker_uid": w.UID, "worker_revision": w.Revision,
		"space": w.Space, "worker_name": w.Name, "offering_id": w.Placement.OfferingID, "offering_digest": w.Placement.OfferingDigest,
		"pack": w.Placement.Pack, "installation": w.Placement.Installation,
	}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Reservation{}, apierr.New(apierr.IntentInProgress, "reservation %q changed while binding; retry", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: bind: %w", err)
	}
	return r, nil
}

// Activate moves a bound reservation to activated with the exact endpoint (SPEC 3.3,
// activation). A retained witness of an earlier endpoint is let go of in place first, under the
// fences; replaying the same endpoint is idempotent.
func (s *Service) Activate(ctx context.Context, tx pgx.Tx, orgID, id string, e EndpointIncarnation) (Reservation, error) {
	current, err := get(ctx, tx, orgID, id)
	if err != nil {
		return Reservation{}, err
	}
	if current.Status == "activated" && current.EndpointUID != nil && *current.EndpointUID == e.UID {
		return current, nil
	}
	if err := mustBeLive(current); err != nil {
		return Reservation{}, err
	}
	switch {
	case current.Status == "activated":
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "reservation %q is activated with another endpoint (uid %s); delete that activation first", id, current.EndpointUID)
	case current.Status != "bound":
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "reservation %q is %s; it must be bound to the endpoint's worker first (create the endpoint with this reservation)", id, current.Status)
	case *current.BoundWorkerUID != e.WorkerUID:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "the endpoint belongs to worker uid %s, but reservation %q is bound to %s", e.WorkerUID, id, current.BoundWorkerUID)
	case current.CanonicalOrigin != e.CanonicalOrigin:
		return Reservation{}, apierr.New(apierr.ActivationMismatch, "the endpoint serves %s, but reservation %q holds %s", e.CanonicalOrigin, id, current.CanonicalOrigin)
	case current.Pack != e.Placement.Pack || current.Installation != e.Placement.Installation:
		return Reservation{}, apierr.New(apierr.PlacementDrift, "the endpoint runs on %s/%s, but reservation %q is placed on %s/%s", e.Placement.Pack, e.Placement.Installation, id, current.Pack, current.Installation)
	}
	if current.EndpointUID != nil && *current.EndpointUID != e.UID {
		if _, err := s.ClearWitness(ctx, tx, orgID, id); err != nil {
			return Reservation{}, err
		}
	}
	r, err := scan(tx.QueryRow(ctx, store.Q("ReservationActivate"), pgx.NamedArgs{
		"organization_id": orgID, "id": id, "endpoint_uid": e.UID, "endpoint_revision": e.Revision,
		"worker_uid": e.WorkerUID, "canonical_origin": e.CanonicalOrigin, "pack": e.Placement.Pack, "installation": e.Placement.Installation,
	}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Reservation{}, apierr.New(apierr.IntentInProgress, "reservation %q changed while activating; retry", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: activate: %w", err)
	}
	return r, nil
}

// Deactivate moves an activated reservation back to bound, keeping the endpoint as the deletion
// witness. A reservation that is not activated is left as it is.
func (s *Service) Deactivate(ctx context.Context, tx pgx.Tx, orgID, id string) (Reservation, error) {
	current, err := get(ctx, tx, orgID, id)
	if err != nil {
		return Reservation{}, err
	}
	if current.Status != "activated" {
		return current, nil
	}
	r, err := scan(tx.QueryRow(ctx, store.Q("ReservationDeactivate"), pgx.NamedArgs{"organization_id": orgID, "id": id}))
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: deactivate: %w", err)
	}
	return r, nil
}

// ClearWitness drops a witness that is provably gone (SPEC 3.4, letting go in place). It reports
// whether the witness was cleared; unmet fences refuse with release_fenced.
func (s *Service) ClearWitness(ctx context.Context, tx pgx.Tx, orgID, id string) (bool, error) {
	var lease, present, attestation, deployment, cleared bool
	err := tx.QueryRow(ctx, store.Q("ReservationClearWitness"), pgx.NamedArgs{"organization_id": orgID, "id": id}).
		Scan(&lease, &present, &attestation, &deployment, &cleared)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil // nothing retained
	}
	if err != nil {
		return false, fmt.Errorf("reservation: clear witness: %w", err)
	}
	if !cleared {
		return false, fenced(id, false, lease, present, attestation, deployment)
	}
	return true, nil
}

func fenced(id string, activation, lease, present, attestation, deployment bool) *apierr.Error {
	unmet := []string{}
	for _, f := range []struct {
		on   bool
		name string
	}{{activation, "activation"}, {lease, "lease_claimed"}, {present, "endpoint_present"}, {attestation, "attestation_open"}, {deployment, "deployment_live"}} {
		if f.on {
			unmet = append(unmet, f.name)
		}
	}
	return apierr.New(apierr.ReleaseFenced, "reservation %q cannot let go of its origin yet: unmet fences %v (destroy the activation, then the endpoint, and wait for its deletion to close)", id, unmet).
		With("unmetFences", unmet)
}

// release applies the four-fence release in one statement.
func release(ctx context.Context, tx pgx.Tx, orgID, id string, uid uuid.UUID) error {
	var status string
	var activation, lease, present, attestation, deployment, released bool
	err := tx.QueryRow(ctx, store.Q("ReservationReleaseFenced"), pgx.NamedArgs{"organization_id": orgID, "id": id, "uid": uid}).
		Scan(&status, &activation, &lease, &present, &attestation, &deployment, &released)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	if err != nil {
		return fmt.Errorf("reservation: release: %w", err)
	}
	if released || status == "released" {
		return nil
	}
	return fenced(id, activation, lease, present, attestation, deployment)
}
