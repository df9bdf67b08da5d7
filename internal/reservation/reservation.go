// Package reservation is the authority over worker endpoint origin reservations (SPEC 3.3):
// value-free holds on one canonical origin, unique per (organization, space, worker) and per origin
// across all organizations, enforced by partial unique indexes.
package reservation

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// Kind is the ownership kind of reservations; ResourceType the provider resource that holds them.
const (
	Kind         = "worker-endpoint-origin-reservation"
	ResourceType = "takoform_worker_endpoint_origin_reservation"
	FormatV1     = "takoserver.worker-endpoint-origin-reservation.v1"
	FormatV2     = "takoserver.worker-endpoint-origin-reservation.v2"
)

// TTL bounds; the default is 24 hours (SPEC 3.3).
const (
	DefaultTTLSeconds = 24 * 60 * 60
	MinTTLSeconds     = 60
	MaxTTLSeconds     = 30 * 24 * 60 * 60
)

var (
	namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	idPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{2,62}$`)
	// mintedIDPattern is the shape of a Host-minted id: readable, never writable by callers.
	mintedIDPattern = regexp.MustCompile(`^hostmint-[0-9a-f]{40}$`)
)

// Request is the body of PUT /v1/worker-endpoint-origin-reservations/{id}.
type Request struct {
	Space      string  `json:"space"`
	WorkerName string  `json:"workerName"`
	Subdomain  *string `json:"subdomain,omitempty"`
	TTLSeconds *int    `json:"ttlSeconds,omitempty"`
	OfferingID *string `json:"offeringId,omitempty"`
}

// Reservation is one stored row.
type Reservation struct {
	OrganizationID      string
	ID                  string
	UID                 uuid.UUID
	Format              string
	Space               string
	WorkerName          string
	Subdomain           string
	CanonicalOrigin     string
	TTLSeconds          int
	Revision            int64
	Status              string
	ExpiresAt           time.Time
	HostMinted          bool
	BoundWorkerUID      *uuid.UUID
	BoundWorkerRevision *int64
	EndpointUID         *uuid.UUID
	EndpointRevision    *int64
	OfferingID          string
	OfferingDigest      string
	Pack                string
	Installation        string
}

// ObjectRef is a {uid, revision} pair in a projection.
type ObjectRef struct {
	UID      string `json:"uid"`
	Revision int64  `json:"revision"`
}

// Projection is the public view of a reservation. Placement is never projected.
type Projection struct {
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

// Project renders r with its ownership token (nil for Host-minted rows, which no caller owns).
func (r Reservation) Project(token string) Projection {
	p := Projection{
		Format: r.Format, ID: r.ID, Space: r.Space, WorkerName: r.WorkerName, Subdomain: r.Subdomain,
		CanonicalOrigin: r.CanonicalOrigin, Revision: r.Revision, ExpiresAt: r.ExpiresAt.UTC().Format(time.RFC3339),
		Status: r.Status, HostMinted: r.HostMinted,
	}
	if r.BoundWorkerUID != nil {
		p.BoundWorker = &ObjectRef{UID: r.BoundWorkerUID.String(), Revision: *r.BoundWorkerRevision}
	}
	if r.EndpointUID != nil {
		p.Endpoint = &ObjectRef{UID: r.EndpointUID.String(), Revision: *r.EndpointRevision}
	}
	if token != "" {
		p.OwnershipToken = &token
	}
	return p
}

// JSON is the projection's bytes, as stored for replay and sent.
func (p Projection) JSON() []byte { return wire.JSON(p) }

// Service reads and changes reservations.
type Service struct {
	Catalog *catalog.Catalog
}

// CheckID refuses an id a caller may not write: malformed, or in the Host-minted namespace.
func CheckID(id string) error {
	if strings.HasPrefix(id, backend.HostMintedPrefix) {
		return apierr.New(apierr.HostMintNamespace, "reservation ids starting with %q are minted by the Host; choose another id", backend.HostMintedPrefix)
	}
	if !idPattern.MatchString(id) {
		return apierr.New(apierr.InvalidRequest, "reservation id %q must match %s", id, idPattern)
	}
	return nil
}

// CheckReadableID refuses an id that can name no reservation at all.
func CheckReadableID(id string) error {
	if mintedIDPattern.MatchString(id) {
		return nil
	}
	if !idPattern.MatchString(id) {
		return apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	return nil
}

// desired is what a request asks for once defaults and derivation are applied.
type desired struct {
	space, workerName, subdomain, origin string
	ttl                                  int
	offering                             catalog.Offering
	inst                                 catalog.Installation
}

func (s *Service) resolve(org auth.Organization, req Request) (desired, error) {
	if !namePattern.MatchString(req.Space) {
		return desired{}, apierr.New(apierr.InvalidRequest, "space %q must match %s", req.Space, namePattern)
	}
	if !namePattern.MatchString(req.WorkerName) {
		return desired{}, apierr.New(apierr.InvalidRequest, "workerName %q must match %s", req.WorkerName, namePattern)
	}
	d := desired{space: req.Space, workerName: req.WorkerName, ttl: DefaultTTLSeconds}
	if req.TTLSeconds != nil {
		if *req.TTLSeconds < MinTTLSeconds || *req.TTLSeconds > MaxTTLSeconds {
			return desired{}, apierr.New(apierr.InvalidRequest, "ttlSeconds must be between %d and %d", MinTTLSeconds, MaxTTLSeconds)
		}
		d.ttl = *req.TTLSeconds
	}
	offeringID := ""
	if req.OfferingID != nil {
		offeringID = *req.OfferingID
	}
	var err error
	d.offering, d.inst, err = s.Catalog.Select(catalog.Organization{ID: org.ID, Name: org.Name}, catalog.KindWorker, offeringID)
	switch {
	case errors.Is(err, catalog.ErrOfferingAmbiguous):
		return desired{}, apierr.New(apierr.OfferingAmbiguous, "%s", strings.TrimPrefix(err.Error(), "offering_ambiguous: "))
	case errors.Is(err, catalog.ErrOfferingUnknown):
		return desired{}, apierr.New(apierr.OfferingUnknown, "%s", strings.TrimPrefix(err.Error(), "offering_unknown: "))
	case err != nil:
		return desired{}, err
	}
	b, err := backend.For(d.inst)
	if err != nil {
		return desired{}, err
	}
	if req.Subdomain != nil {
		if !backend.ValidLabel(*req.Subdomain) {
			return desired{}, apierr.New(apierr.InvalidRequest, "subdomain %q is not one lowercase DNS label", *req.Subdomain)
		}
		d.subdomain = *req.Subdomain
	} else {
		d.subdomain = b.DefaultLabel(backend.WorkerRef{TenantRef: org.ID, Space: req.Space, Name: req.WorkerName})
	}
	d.origin = b.CanonicalOrigin(d.subdomain)
	return d, nil
}

func scan(row pgx.Row) (Reservation, error) {
	var r Reservation
	err := row.Scan(&r.OrganizationID, &r.ID, &r.UID, &r.Format, &r.Space, &r.WorkerName, &r.Subdomain,
		&r.CanonicalOrigin, &r.TTLSeconds, &r.Revision, &r.Status, &r.ExpiresAt, &r.HostMinted,
		&r.BoundWorkerUID, &r.BoundWorkerRevision, &r.EndpointUID, &r.EndpointRevision,
		&r.OfferingID, &r.OfferingDigest, &r.Pack, &r.Installation)
	return r, err
}

// sweep expires, lazily, every prepared or bound row whose TTL passed among those a read or write
// of (id, space/worker, origin) could meet (SPEC 3.3: expiry is lazy).
func sweep(ctx context.Context, tx pgx.Tx, orgID, id, space, worker, origin string) error {
	_, err := tx.Exec(ctx, store.Q("ReservationSweepExpired"), pgx.NamedArgs{
		"organization_id": orgID, "id": id, "space": space, "worker_name": worker, "canonical_origin": origin,
	})
	if err != nil {
		return fmt.Errorf("reservation: sweep: %w", err)
	}
	return nil
}

func get(ctx context.Context, tx pgx.Tx, orgID, id string) (Reservation, error) {
	if err := sweep(ctx, tx, orgID, id, "", "", ""); err != nil {
		return Reservation{}, err
	}
	r, err := scan(tx.QueryRow(ctx, store.Q("ReservationGetByID"), pgx.NamedArgs{"organization_id": orgID, "id": id}))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && r.Status == "released") {
		return Reservation{}, apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: get: %w", err)
	}
	return r, nil
}

// Get reads one reservation of the organization. Released rows and other organizations' rows are
// reported as absent.
func (s *Service) Get(ctx context.Context, tx pgx.Tx, org auth.Organization, id string) (Reservation, error) {
	if err := CheckReadableID(id); err != nil {
		return Reservation{}, err
	}
	return get(ctx, tx, org.ID, id)
}

// Create makes a new reservation incarnation in state prepared.
func (s *Service) Create(ctx context.Context, tx pgx.Tx, org auth.Organization, id string, req Request) (Reservation, error) {
	if err := CheckID(id); err != nil {
		return Reservation{}, err
	}
	d, err := s.resolve(org, req)
	if err != nil {
		return Reservation{}, err
	}
	if err := sweep(ctx, tx, org.ID, id, d.space, d.workerName, d.origin); err != nil {
		return Reservation{}, err
	}
	// A savepoint keeps the transaction usable when a unique index refuses the insert.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: create: %w", err)
	}
	r, err := scan(sp.QueryRow(ctx, store.Q("ReservationCreate"), pgx.NamedArgs{
		"organization_id": org.ID, "id": id, "uid": uuid.New(), "space": d.space, "worker_name": d.workerName,
		"subdomain": d.subdomain, "canonical_origin": d.origin, "ttl_seconds": d.ttl,
		"offering_id": d.offering.ID, "offering_digest": d.offering.Digest, "pack": d.offering.Pack, "installation": d.inst.Name,
	}))
	switch {
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_origin_key"):
		_ = sp.Rollback(ctx)
		return Reservation{}, apierr.New(apierr.OriginTaken, "origin %s is held by another live reservation", d.origin)
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_worker_key"):
		_ = sp.Rollback(ctx)
		return Reservation{}, apierr.New(apierr.ReservationConflict, "another live reservation already holds worker %s/%s", d.space, d.workerName)
	case errors.Is(err, pgx.ErrNoRows):
		_ = sp.Rollback(ctx)
		return Reservation{}, apierr.New(apierr.ReservationConflict, "reservation %q already exists and is not owned through the ownership protocol", id)
	case err != nil:
		_ = sp.Rollback(ctx)
		return Reservation{}, fmt.Errorf("reservation: create: %w", err)
	}
	if err := sp.Commit(ctx); err != nil {
		return Reservation{}, fmt.Errorf("reservation: create: %w", err)
	}
	return r, nil
}

// Reconcile answers a changed request from the reservation's owner. A reservation never changes
// in place: it succeeds only when the request resolves to exactly what is held (SPEC 3.3).
func (s *Service) Reconcile(ctx context.Context, tx pgx.Tx, org auth.Organization, id string, req Request) (Reservation, error) {
	if err := CheckID(id); err != nil {
		return Reservation{}, err
	}
	d, err := s.resolve(org, req)
	if err != nil {
		return Reservation{}, err
	}
	r, err := get(ctx, tx, org.ID, id)
	if err != nil {
		return Reservation{}, err
	}
	var diffs []string
	if r.Space != d.space || r.WorkerName != d.workerName {
		diffs = append(diffs, "space/workerName")
	}
	if r.Subdomain != d.subdomain || r.CanonicalOrigin != d.origin {
		diffs = append(diffs, "subdomain")
	}
	if r.TTLSeconds != d.ttl {
		diffs = append(diffs, "ttlSeconds")
	}
	if r.OfferingID != d.offering.ID || r.OfferingDigest != d.offering.Digest || r.Pack != d.offering.Pack || r.Installation != d.inst.Name {
		diffs = append(diffs, "placement")
	}
	if len(diffs) > 0 {
		return Reservation{}, apierr.New(apierr.ReservationMismatch, "reservation %q already exists with a different %s; a reservation cannot change in place (replace it)", id, strings.Join(diffs, ", ")).
			With("mismatch", diffs)
	}
	return r, nil
}

// Release lets go of a reservation under the four fences of SPEC 3.3; releasing a released one
// succeeds (release is idempotent once terminal).
func (s *Service) Release(ctx context.Context, tx pgx.Tx, org auth.Organization, id string, uid uuid.UUID) (Reservation, error) {
	if err := CheckID(id); err != nil {
		return Reservation{}, err
	}
	if err := sweep(ctx, tx, org.ID, id, "", "", ""); err != nil {
		return Reservation{}, err
	}
	if err := release(ctx, tx, org.ID, id, uid); err != nil {
		return Reservation{}, err
	}
	r, err := scan(tx.QueryRow(ctx, store.Q("ReservationGetByID"), pgx.NamedArgs{"organization_id": org.ID, "id": id}))
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: release: %w", err)
	}
	return r, nil
}

// Derivation is the answer of the non-mutating derivation route.
type Derivation struct {
	OfferingID          string  `json:"offeringId"`
	CanonicalOrigin     string  `json:"canonicalOrigin"`
	Subdomain           string  `json:"subdomain"`
	HostMintedSubdomain *string `json:"hostMintedSubdomain"`
}

// Derive answers what a reservation PUT with req would hold, through the same resolution as the
// real PUT, writing nothing.
func (s *Service) Derive(org auth.Organization, req Request) (Derivation, error) {
	d, err := s.resolve(org, req)
	if err != nil {
		return Derivation{}, err
	}
	out := Derivation{OfferingID: d.offering.ID, CanonicalOrigin: d.origin, Subdomain: d.subdomain}
	b, err := backend.For(d.inst)
	if err != nil {
		return Derivation{}, err
	}
	if label, ok := b.HostMintedSubdomain(backend.WorkerRef{TenantRef: org.ID, Space: req.Space, Name: req.WorkerName}); ok {
		out.HostMintedSubdomain = &label
	}
	return out, nil
}
