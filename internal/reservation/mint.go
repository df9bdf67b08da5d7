package reservation

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// MintedLabel is the subdomain the Host mints for w on b: the backend's hostMintedSubdomain, or,
// for a backend that sells its base domain (wfp-managed), the managed default label (SPEC 3.4).
func MintedLabel(b backend.Backend, w backend.WorkerRef) string {
	if label, ok := b.HostMintedSubdomain(w); ok {
		return label
	}
	return backend.DerivedProviderResourceName("tsw", w)
}

// Mint returns the Host-minted reservation of the exact worker incarnation w, making, reviving
// or repairing it as SPEC 3.4 says, bound to w. It never takes an address from a caller's
// reservation and never reallocates one an old endpoint may still answer on. The endpoint create
// that called it then records itself on the row through Bind.
func (s *Service) Mint(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, b backend.Backend) (Reservation, error) {
	ref := backend.WorkerRef{TenantRef: w.OrganizationID, Space: w.Space, Name: w.Name, UID: w.UID.String()}
	id := backend.HostMintedReservationID(ref)
	label := MintedLabel(b, ref)
	origin := b.CanonicalOrigin(label)
	q := dbsqlc.New(tx)

	// The mint sweeps its own row (and whatever it could conflict with) before deciding anything.
	if err := sweep(ctx, q, w.OrganizationID, id, w.Space, w.Name, origin); err != nil {
		return Reservation{}, err
	}
	// Earlier incarnations of this worker name hold the same address until released under the
	// four fences; an activated one has its witness cleared in place first.
	if err := s.releaseSuperseded(ctx, tx, w, id); err != nil {
		return Reservation{}, err
	}

	row, err := q.ReservationLock(ctx, dbsqlc.ReservationLockParams{OrganizationID: w.OrganizationID, ID: id})
	switch {
	case errors.Is(err, pgx.ErrNoRows), err == nil && row.EffectiveStatus == dbsqlc.ReservationStatusReleased:
		// A new row counts toward the organization's reservation ceiling (SPEC 5.1), as a
		// caller's does: Host-minted reservations hold an origin just the same.
		if err := quota.Check(ctx, tx, s.Catalog.Quotas, w.OrganizationID, quota.Reservations); err != nil {
			return Reservation{}, err
		}
		return s.insertMinted(ctx, tx, w, id, label, origin)
	case err != nil:
		return Reservation{}, fmt.Errorf("reservation: mint: %w", err)
	}
	current := fromRow(row.WorkerEndpointOriginReservation, row.EffectiveStatus)
	if current.Status == dbsqlc.ReservationStatusExpired {
		if current.EndpointUID != nil {
			// It published: waiting does not free the address. Repair it by the in-place clear,
			// under the four fences, then revive it.
			if _, err := s.ClearWitness(ctx, tx, w.OrganizationID, id); err != nil {
				return Reservation{}, err
			}
		}
		if current.Status != row.WorkerEndpointOriginReservation.Status {
			// Expired by time but not yet swept (it never conflicted with anything): store it.
			if err := sweep(ctx, q, w.OrganizationID, id, "", "", ""); err != nil {
				return Reservation{}, err
			}
		}
		// A revived row is live again, so it counts again.
		if err := quota.Check(ctx, tx, s.Catalog.Quotas, w.OrganizationID, quota.Reservations); err != nil {
			return Reservation{}, err
		}
		if err := revive(ctx, tx, w, id); err != nil {
			return Reservation{}, err
		}
	}
	return lock(ctx, tx, w.OrganizationID, id)
}

func (s *Service) insertMinted(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id, label, origin string) (Reservation, error) {
	// A unique index refusing the insert refuses the request: the transaction ends with it.
	row, err := dbsqlc.New(tx).ReservationMint(ctx, dbsqlc.ReservationMintParams{
		OrganizationID: w.OrganizationID, ID: id, UID: uuid.Must(uuid.NewV7()), Space: w.Space, WorkerName: w.Name,
		Subdomain: label, CanonicalOrigin: origin, TTLSeconds: DefaultTTLSeconds,
		WorkerUID: &w.UID, WorkerRevision: &w.Revision, OfferingID: w.Placement.OfferingID,
		OfferingDigest: w.Placement.OfferingDigest, Pack: w.Placement.Pack, Installation: w.Placement.Installation,
	})
	switch {
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_origin_key"):
		return Reservation{}, apierr.New(apierr.OriginTaken, "origin %s is held by another reservation; the Host does not take it", origin).
			With("canonicalOrigin", origin)
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_worker_key"):
		return Reservation{}, apierr.New(apierr.ReservationConflict, "a reservation already holds worker %s/%s; create the endpoint with that reservation (originReservationId)", w.Space, w.Name)
	case errors.Is(err, pgx.ErrNoRows):
		// Another request minted this very row in the meantime (two first mints for one worker).
		return Reservation{}, apierr.New(apierr.IntentInProgress, "the Host-minted reservation of worker %s/%s is being minted by another request; retry", w.Space, w.Name)
	case err != nil:
		return Reservation{}, fmt.Errorf("reservation: mint: %w", err)
	}
	return fromRow(row, ""), nil
}

func revive(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id string) error {
	_, err := dbsqlc.New(tx).ReservationRevive(ctx, dbsqlc.ReservationReviveParams{OrganizationID: w.OrganizationID, ID: id, WorkerUID: &w.UID})
	switch {
	case store.IsUniqueViolation(err, ""):
		return apierr.New(apierr.OriginTaken, "the expired Host-minted reservation %q cannot come back without displacing another reservation", id)
	case errors.Is(err, pgx.ErrNoRows):
		return apierr.New(apierr.BoundElsewhere, "the expired Host-minted reservation %q belongs to another incarnation", id)
	case err != nil:
		return fmt.Errorf("reservation: revive: %w", err)
	}
	return nil
}

// releaseSuperseded releases the Host-minted rows of earlier incarnations of w's name, each under
// the four fences; an unmet fence stops the mint.
func (s *Service) releaseSuperseded(ctx context.Context, tx pgx.Tx, w WorkerIncarnation, id string) error {
	siblings, err := dbsqlc.New(tx).ReservationHostMintedSiblings(ctx, dbsqlc.ReservationHostMintedSiblingsParams{
		OrganizationID: w.OrganizationID, Space: w.Space, WorkerName: w.Name, ID: id,
	})
	if err != nil {
		return fmt.Errorf("reservation: superseded: %w", err)
	}
	for _, old := range siblings {
		if _, err := s.ClearWitness(ctx, tx, w.OrganizationID, old.ID); err != nil {
			return err
		}
		if _, err := release(ctx, tx, w.OrganizationID, old.ID, old.UID); err != nil {
			return err
		}
	}
	return nil
}

// ReleaseMintedOf releases, under the four fences, the Host-minted rows bound to a worker whose
// deletion has closed (SPEC 3.4): that UID can never mint again. A row whose fences are unmet is
// left for the janitor.
func (s *Service) ReleaseMintedOf(ctx context.Context, tx pgx.Tx, orgID string, workerUID uuid.UUID) error {
	rows, err := dbsqlc.New(tx).ReservationMintedOfWorker(ctx, dbsqlc.ReservationMintedOfWorkerParams{OrganizationID: orgID, WorkerUID: &workerUID})
	if err != nil {
		return fmt.Errorf("reservation: minted rows of worker: %w", err)
	}
	for _, r := range rows {
		if err := s.releaseIfFree(ctx, tx, orgID, r.ID, r.UID); err != nil {
			return err
		}
	}
	return nil
}

// releaseIfFree releases a Host-minted row when its fences allow, in a savepoint, and leaves it
// otherwise.
func (s *Service) releaseIfFree(ctx context.Context, tx pgx.Tx, orgID, id string, uid uuid.UUID) error {
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := s.ClearWitness(ctx, sp, orgID, id); err == nil {
		_, err = release(ctx, sp, orgID, id, uid)
		if err == nil {
			return sp.Commit(ctx)
		}
	}
	_ = sp.Rollback(ctx)
	return nil
}

// ExpireLapsed stores the lazy expiry of every reservation whose TTL passed without its
// publishing (SPEC 3.3), in batches (store.Sweep): the janitor's step, so that a lapsed
// reservation nothing touches again stops counting toward its organization's ceiling in the quota
// counters as it already does in the exact count. It reports how many it expired.
func (s *Service) ExpireLapsed(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return store.Sweep(ctx, dbsqlc.New(db).ReservationsExpireLapsed)
}

// ReleaseGone releases the Host-minted rows of deleted workers that a worker delete's tail could
// not release yet, for the janitor. It reports how many it released.
func (s *Service) ReleaseGone(ctx context.Context, db store.Beginner) (int, error) {
	n := 0
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		rows, err := dbsqlc.New(tx).ReservationsOfGoneWorkers(ctx)
		if err != nil {
			return err
		}
		for _, r := range rows {
			before := n
			if err := s.releaseIfFree(ctx, tx, r.OrganizationID, r.ID, r.UID); err != nil {
				return err
			}
			if row, err := dbsqlc.New(tx).ReservationRead(ctx, dbsqlc.ReservationReadParams{OwnershipKind: Kind, OrganizationID: r.OrganizationID, ID: r.ID}); err == nil && row.EffectiveStatus == dbsqlc.ReservationStatusReleased {
				n = before + 1
			}
		}
		return nil
	})
	return n, err
}
