package reservation

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// MintedLabel is the subdomain the Host mints for w on b: the backend's hostMintedSubdomain, or,
// for a backend that sells its base domain (wfp-managed), the managed default label (SPEC 3.4).
func MintedLabel(b backend.Backend, w backend.WorkerRef) string {
	if label, ok := b.HostMintedSubdomain(w); ok {
		return label
	}
	return backend.DerivedProviderResourceName("tsw", w)
}

// Mint returns the Host-minted reservation of the exact worker incarnation w, bound to it, making,
// reviving or repairing it as SPEC 3.4 says. It never takes an address from a caller's live
// reservation and never reallocates one an old endpoint may still answer on.
func (s *Service) Mint(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, b backend.Backend) (Reservation, error) {
	ref := backend.WorkerRef{TenantRef: w.OrganizationID, Space: w.Space, Name: w.Name, UID: w.UID.String()}
	id := backend.HostMintedReservationID(ref)
	label := MintedLabel(b, ref)
	origin := b.CanonicalOrigin(label)

	// The mint sweeps its own row (and whatever it could conflict with) before deciding anything.
	if err := sweep(ctx, tx, w.OrganizationID, id, w.Space, w.Name, origin); err != nil {
		return Reservation{}, err
	}

	// Earlier incarnations of this worker name hold the same address until released under the
	// four fences; an activated one has its witness cleared in place first.
	if err := s.releaseSuperseded(ctx, tx, w, id); err != nil {
		return Reservation{}, err
	}

	current, err := scan(tx.QueryRow(ctx, store.Q("ReservationGetAny"), pgx.NamedArgs{"organization_id": w.OrganizationID, "id": id}))
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && current.Status == "released":
		return s.insertMinted(ctx, tx, w, id, label, origin)
	case err != nil:
		return Reservation{}, fmt.Errorf("reservation: mint: %w", err)
	}

	if current.Status == "expired" {
		if current.EndpointUID != nil {
			// It published: waiting does not free the address. Repair it by the in-place clear,
			// under the four fences, then revive it.
			if _, err := s.ClearWitness(ctx, tx, w.OrganizationID, id); err != nil {
				return Reservation{}, err
			}
		}
		if err := revive(ctx, tx, w, id); err != nil {
			return Reservation{}, err
		}
	} else if current.EndpointUID != nil {
		// A deactivated row still holds its old endpoint, or an activated one names an endpoint
		// that may never have committed: let go of it in place if it is provably gone.
		if _, err := s.ClearWitness(ctx, tx, w.OrganizationID, id); err != nil {
			return Reservation{}, err
		}
	}
	return s.Bind(ctx, tx, id, w)
}

func (s *Service) insertMinted(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id, label, origin string) (Reservation, error) {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Reservation{}, err
	}
	r, err := scan(sp.QueryRow(ctx, store.Q("ReservationMint"), pgx.NamedArgs{
		"organization_id": w.OrganizationID, "id": id, "uid": uuid.New(), "space": w.Space, "worker_name": w.Name,
		"subdomain": label, "canonical_origin": origin, "ttl_seconds": DefaultTTLSeconds,
		"worker_uid": w.UID, "worker_revision": w.Revision, "offering_id": w.Placement.OfferingID,
		"offering_digest": w.Placement.OfferingDigest, "pack": w.Placement.Pack, "installation": w.Placement.Installation,
	}))
	if err != nil {
		_ = sp.Rollback(ctx)
	}
	switch {
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_origin_key"):
		return Reservation{}, apierr.New(apierr.OriginTaken, "origin %s is held by another reservation; the Host does not take it", origin)
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_worker_key"):
		return Reservation{}, apierr.New(apierr.ReservationConflict, "a live reservation already holds worker %s/%s; create the endpoint with that reservation (originReservationId)", w.Space, w.Name)
	case err != nil:
		return Reservation{}, fmt.Errorf("reservation: mint: %w", err)
	}
	return r, sp.Commit(ctx)
}

func revive(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id string) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = scan(sp.QueryRow(ctx, store.Q("ReservationRevive"), pgx.NamedArgs{"organization_id": w.OrganizationID, "id": id, "worker_uid": w.UID}))
	if err != nil {
		_ = sp.Rollback(ctx)
	}
	switch {
	case store.IsUniqueViolation(err, ""):
		return apierr.New(apierr.OriginTaken, "the expired Host-minted reservation %q cannot come back without displacing a live reservation", id)
	case errors.Is(err, pgx.ErrNoRows):
		return apierr.New(apierr.BoundElsewhere, "the expired Host-minted reservation %q belongs to another incarnation", id)
	case err != nil:
		return fmt.Errorf("reservation: revive: %w", err)
	}
	return sp.Commit(ctx)
}

// releaseSuperseded releases the Host-minted rows of earlier incarnations of w's name.
func (s *Service) releaseSuperseded(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id string) error {
	rows, err := tx.Query(ctx, store.Q("ReservationHostMintedSiblings"), pgx.NamedArgs{
		"organization_id": w.OrganizationID, "space": w.Space, "worker_name": w.Name, "id": id,
	})
	if err != nil {
		return fmt.Errorf("reservation: superseded: %w", err)
	}
	type sibling struct {
		id  string
		uid uuid.UUID
	}
	var siblings []sibling
	var sib sibling
	if _, err := pgx.ForEachRow(rows, []any{&sib.id, &sib.uid}, func() error { siblings = append(siblings, sib); return nil }); err != nil {
		return fmt.Errorf("reservation: superseded: %w", err)
	}
	for _, old := range siblings {
		if _, err := s.ClearWitness(ctx, tx, w.OrganizationID, old.id); err != nil {
			return err
		}
		if err := release(ctx, tx, w.OrganizationID, old.id, old.uid); err != nil {
			return err
		}
	}
	return nil
}
