// Package reservation is the authority over worker endpoint origin reservations (SPEC 3.3):
// value-free holds on one canonical origin, unique per (organization, space, worker) and per origin
// across all organizations, enforced by partial unique indexes, with every transition a single
// compare-and-swap statement.
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

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
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
	// mintedIDPattern is the shape of a Host-minted id: readable, never writable by callers.
	mintedIDPattern = regexp.MustCompile(`^hostmint-[0-9a-f]{40}$`)
)

// Request is the body of PUT /v1/worker-endpoint-origin-reservations/{id}.
type Request = apitypes.ReservationRequest

// Reservation is one stored row, its Status as of database time.
type Reservation struct {
	OrganizationID      string
	ID                  string
	UID                 uuid.UUID
	Format              string
	Space               string
	WorkerName          string
	Subdomain           string
	Hostname            *string
	CanonicalOrigin     string
	TTLSeconds          int
	Revision            int64
	Status              dbsqlc.ReservationStatus
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

func fromRow(r dbsqlc.WorkerEndpointOriginReservation, status dbsqlc.ReservationStatus) Reservation {
	if status == "" {
		status = r.Status
	}
	return Reservation{
		OrganizationID: r.OrganizationID, ID: r.ID, UID: r.UID, Format: r.Format, Space: r.Space, WorkerName: r.WorkerName,
		Subdomain: r.Subdomain, Hostname: r.Hostname, CanonicalOrigin: r.CanonicalOrigin, TTLSeconds: int(r.TTLSeconds), Revision: r.Revision,
		Status: status, ExpiresAt: r.ExpiresAt, HostMinted: r.HostMinted, BoundWorkerUID: r.BoundWorkerUID,
		BoundWorkerRevision: r.BoundWorkerRevision, EndpointUID: r.EndpointUID, EndpointRevision: r.EndpointRevision,
		OfferingID: r.OfferingID, OfferingDigest: r.OfferingDigest, Pack: r.Pack, Installation: r.Installation,
	}
}

// ObjectRef is a {uid, revision} pair in a projection.
type ObjectRef = apitypes.ObjectRef

// Projection is the public view of a reservation: the document's Reservation (api/apitypes),
// with the bytes a response carries. Placement is never projected.
type Projection apitypes.Reservation

// Project renders r with its ownership token (nil for Host-minted rows, which no caller owns).
func (r Reservation) Project(token string) Projection {
	p := Projection{
		Format: r.Format, ID: r.ID, Space: r.Space, WorkerName: r.WorkerName, Subdomain: r.Subdomain,
		CanonicalOrigin: r.CanonicalOrigin, Revision: r.Revision, ExpiresAt: r.ExpiresAt.UTC().Format(time.RFC3339),
		Status: string(r.Status), HostMinted: r.HostMinted, Hostname: r.Hostname,
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

// Placement returns where the reservation was placed.
func (r Reservation) Placement() catalog.Placement {
	return catalog.Placement{OfferingID: r.OfferingID, OfferingDigest: r.OfferingDigest, Pack: r.Pack, Installation: r.Installation}
}

// Live reports whether the row holds its origin as a live reservation.
func (r Reservation) Live() bool {
	return r.Status == dbsqlc.ReservationStatusPrepared || r.Status == dbsqlc.ReservationStatusBound || r.Status == dbsqlc.ReservationStatusActivated
}

// Service reads and changes reservations.
type Service struct {
	Catalog *catalog.Catalog
}

// CheckID refuses an id a caller may not write: malformed, or in the Host-minted namespace.
func CheckID(id string) error {
	if strings.HasPrefix(id, backend.HostMintedPrefix) {
		return apierr.New(apierr.HostMintNamespace, "reservation ids starting with %q are minted by the Host; choose another id", backend.HostMintedPrefix)
	}
	if !vocab.ReservationID.MatchString(id) {
		return apierr.New(apierr.InvalidRequest, "reservation id %q must match %s", id, vocab.ReservationIDPattern)
	}
	return nil
}

// CheckReadableID refuses an id that can name no reservation at all.
func CheckReadableID(id string) error {
	if mintedIDPattern.MatchString(id) || vocab.ReservationID.MatchString(id) {
		return nil
	}
	return apierr.New(apierr.NotFound, "no reservation %q", id)
}

// desired is what a request asks for once defaults and derivation are applied.
type desired struct {
	space, workerName, subdomain, origin string
	// hostname is a custom hostname the reservation holds instead of a subdomain (SPEC 3.7), and
	// customDomain the organization's verified claim that covers it (set by checkDomain).
	hostname, customDomain string
	ttl                    int
	offering               catalog.Offering
	inst                   catalog.Installation
	backend                backend.Backend
	// chosen: the subdomain is the caller's choice, not the worker's own derived label.
	chosen bool
}

func (s *Service) resolve(org auth.Organization, req Request) (desired, error) {
	if !vocab.Name.MatchString(req.Space) {
		return desired{}, apierr.New(apierr.InvalidRequest, "space %q must match %s", req.Space, vocab.NamePattern)
	}
	if !vocab.Name.MatchString(req.WorkerName) {
		return desired{}, apierr.New(apierr.InvalidRequest, "workerName %q must match %s", req.WorkerName, vocab.NamePattern)
	}
	d := desired{space: req.Space, workerName: req.WorkerName, ttl: DefaultTTLSeconds}
	if req.TTLSeconds != nil {
		if *req.TTLSeconds < MinTTLSeconds || *req.TTLSeconds > MaxTTLSeconds {
			return desired{}, apierr.New(apierr.InvalidRequest, "ttlSeconds must be between %d and %d", MinTTLSeconds, MaxTTLSeconds)
		}
		d.ttl = int(*req.TTLSeconds)
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
	if d.backend, err = backend.For(d.inst); err != nil {
		return desired{}, err
	}
	if req.Hostname != nil {
		return s.resolveHostname(d, req)
	}
	own := d.backend.DefaultLabel(backend.WorkerRef{TenantRef: org.ID, Space: req.Space, Name: req.WorkerName})
	d.subdomain = own
	if req.Subdomain != nil {
		if !backend.ValidLabel(*req.Subdomain) {
			return desired{}, apierr.New(apierr.InvalidRequest, "subdomain %q is not one lowercase DNS label", *req.Subdomain)
		}
		if *req.Subdomain != own {
			if err := s.chosen(d, *req.Subdomain, own); err != nil {
				return desired{}, err
			}
			d.subdomain, d.chosen = *req.Subdomain, true
		}
	}
	d.origin = d.backend.CanonicalOrigin(d.subdomain)
	return d, nil
}

// resolveHostname is resolve for a reservation that names a custom hostname: the offering must
// serve custom domains, and the origin is https://<hostname> (SPEC 3.7). Which verified claim
// covers it is checked in the request's transaction (checkDomain).
func (s *Service) resolveHostname(d desired, req Request) (desired, error) {
	h := *req.Hostname
	if req.Subdomain != nil {
		return desired{}, apierr.New(apierr.InvalidRequest, "subdomain and hostname are exclusive: a reservation holds a label under the offering's suffix or a custom hostname")
	}
	if strings.HasPrefix(h, "*.") {
		return desired{}, apierr.New(apierr.InvalidRequest, "hostname %q is a wildcard; a reservation holds one name (a wildcard custom domain covers the names one label below it)", h)
	}
	if _, err := customdomain.Parse(s.Catalog, h); err != nil {
		return desired{}, err
	}
	if d.offering.CustomDomains == nil {
		return desired{}, apierr.New(apierr.CustomDomainUnsupported, "offering %s serves no custom domains; leave hostname out, or choose an offering that does (takoform_offerings shows customDomains)", d.offering.ID)
	}
	d.hostname, d.origin = h, "https://"+h
	return d, nil
}

// checkDomain finds the organization's verified claim that covers a reservation's custom hostname:
// the name itself, or the wildcard one label above it unless another organization verified the
// exact name (SPEC 3.7). lock, in a mutation, holds the claim FOR SHARE until the transaction ends,
// so that a delete of the claim and a reservation under it never both commit.
func checkDomain(ctx context.Context, db dbsqlc.DBTX, org string, d *desired, lock bool) error {
	if d.hostname == "" {
		return nil
	}
	exact, wildcard := customdomain.Covering(d.hostname)
	q := dbsqlc.New(db)
	params := dbsqlc.CustomDomainCoveringParams{OrganizationID: org, Hostname: exact, Wildcard: wildcard}
	var row dbsqlc.CustomDomainCoveringRow
	var err error
	if lock {
		var locked dbsqlc.CustomDomainCoveringLockedRow
		locked, err = q.CustomDomainCoveringLocked(ctx, dbsqlc.CustomDomainCoveringLockedParams(params))
		row = dbsqlc.CustomDomainCoveringRow(locked)
	} else {
		row, err = q.CustomDomainCovering(ctx, params)
	}
	if errors.Is(err, pgx.ErrNoRows) {
		// Another organization's verified claim is said as its PUT would say it (naming nobody),
		// so that a configuration claiming a held name fails at plan.
		taken, terr := q.CustomDomainVerifiedElsewhere(ctx, dbsqlc.CustomDomainVerifiedElsewhereParams{OrganizationID: org, Hostname: exact})
		if terr != nil {
			return fmt.Errorf("reservation: custom domain: %w", terr)
		}
		if taken {
			return apierr.New(apierr.DomainTaken, "hostname %q is verified by another organization; a name has one holder at a time", d.hostname)
		}
		return apierr.New(apierr.DomainNotVerified, "hostname %q is not a verified custom domain of this organization, nor under one of its verified wildcards; claim it (takoform_custom_domain) and publish its TXT record first", d.hostname)
	}
	if err != nil {
		return fmt.Errorf("reservation: custom domain: %w", err)
	}
	if row.Hostname != exact && row.ExactElsewhere {
		return apierr.New(apierr.DomainTaken, "hostname %q is verified by another organization; a wildcard never covers a name verified exactly elsewhere", d.hostname)
	}
	d.customDomain = row.Hostname
	return nil
}

// CheckServable refuses to publish anything new on a reservation whose custom hostname is no
// longer covered by a verified claim of its organization (revoked, or deleted and claimed by
// another organization): SPEC 3.7, "until then nothing new is served on it". A reservation under
// the offering's suffix is always servable.
func CheckServable(ctx context.Context, db dbsqlc.DBTX, r Reservation) error {
	if r.Hostname == nil {
		return nil
	}
	d := desired{hostname: *r.Hostname}
	return checkDomain(ctx, db, r.OrganizationID, &d, true)
}

// CoveringClaim names the organization's verified claim that covers hostname now, or "" when
// none does (the janitor asks before it lets a reservation on a revoked claim go).
func CoveringClaim(ctx context.Context, db dbsqlc.DBTX, org, hostname string) (string, error) {
	d := desired{hostname: hostname}
	err := checkDomain(ctx, db, org, &d, false)
	if e, ok := apierr.As(err); ok && (e.Code == apierr.DomainNotVerified || e.Code == apierr.DomainTaken) {
		return "", nil
	}
	return d.customDomain, err
}

// Shapes of the labels the Host derives (SPEC 3.3, 3.4): a v2 script name, a managed default
// label, and a v1 script name (reserved only while a live script holds it).
var (
	derivedV2Label = regexp.MustCompile(`^[a-z0-9-]+-[0-9a-f]{32}$`)
	managedLabel   = regexp.MustCompile(`^tsw-[0-9a-f]{24}$`)
	derivedV1Label = regexp.MustCompile(`^[a-z0-9-]+-[0-9a-f]{8}$`)
)

// chosen refuses a chosen label (one that is not the caller's own derived label for the worker)
// that the offering does not sell or that takes a shape the Host derives for someone, so that a
// derived address is only ever its own worker's (SPEC 3.3). A v1 script name is checked against
// the live scripts by checkHeld, in the request's transaction.
func (s *Service) chosen(d desired, label, own string) error {
	switch {
	case d.offering.Pack == catalog.PackWorkersDev:
		return apierr.New(apierr.SubdomainNotDerivable, "on workers-dev a worker's address is its own script name: leave subdomain out, or give %s", own)
	case !d.offering.SellsChosenLabels():
		return apierr.New(apierr.LabelNotSold, "offering %s sells no chosen labels; leave subdomain out to get the worker's derived address", d.offering.ID)
	case derivedV2Label.MatchString(label), managedLabel.MatchString(label), strings.HasPrefix(label, backend.HostMintedPrefix):
		return apierr.New(apierr.LabelReserved, "subdomain %q has the shape of a label the Host derives for a worker; such an address is only ever its own worker's (leave subdomain out to get yours)", label)
	case s.Catalog.ReservedLabels[label]:
		return apierr.New(apierr.LabelReserved, "subdomain %q is reserved by the operator", label)
	}
	return nil
}

// checkHeld refuses a chosen label that is a v1 script name a live script of the installation
// holds (its worker's address).
func checkHeld(ctx context.Context, db dbsqlc.DBTX, d desired) error {
	if !d.chosen || !derivedV1Label.MatchString(d.subdomain) {
		return nil
	}
	held, err := dbsqlc.New(db).WorkerScriptNameHeld(ctx, dbsqlc.WorkerScriptNameHeldParams{Installation: d.inst.Name, ScriptName: d.subdomain})
	if err != nil {
		return fmt.Errorf("reservation: label check: %w", err)
	}
	if held {
		return apierr.New(apierr.LabelReserved, "subdomain %q is a live worker's script name, and so its address", d.subdomain)
	}
	return nil
}

func sweep(ctx context.Context, q *dbsqlc.Queries, orgID, id, space, worker, origin string) error {
	if _, err := q.ReservationSweep(ctx, dbsqlc.ReservationSweepParams{
		OrganizationID: orgID, ID: id, Space: space, WorkerName: worker, CanonicalOrigin: origin,
	}); err != nil {
		return fmt.Errorf("reservation: sweep: %w", err)
	}
	return nil
}

// Get reads one reservation of the organization as of database time, with the owning token of
// its ownership key, taking no lock and writing nothing. Released rows and other organizations'
// rows are reported as absent.
func (s *Service) Get(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, id string) (Reservation, string, error) {
	return s.getOwnedAs(ctx, db, org, id, Kind)
}

// GetActivation reads an activated reservation with its activation's ownership token (seed 000:
// Describe returns the token), so that an activation made elsewhere can be adopted by reading.
// A reservation that is not activated has no activation: 404.
func (s *Service) GetActivation(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, id string) (Reservation, string, error) {
	r, token, err := s.getOwnedAs(ctx, db, org, id, ActivationKind)
	if err != nil {
		return r, "", err
	}
	if r.Status != dbsqlc.ReservationStatusActivated {
		return Reservation{}, "", apierr.New(apierr.NotFound, "reservation %q is %s: it has no activation", id, r.Status)
	}
	return r, token, nil
}

// ActivationKind is the ownership kind of activations.
const ActivationKind = "worker-endpoint-activation"

// getOwnedAs reads a reservation with the ownership token its kind's key holds.
func (s *Service) getOwnedAs(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, id, kind string) (Reservation, string, error) {
	if err := CheckReadableID(id); err != nil {
		return Reservation{}, "", err
	}
	row, err := dbsqlc.New(db).ReservationRead(ctx, dbsqlc.ReservationReadParams{OwnershipKind: kind, OrganizationID: org.ID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.EffectiveStatus == dbsqlc.ReservationStatusReleased) {
		return Reservation{}, "", apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	if err != nil {
		return Reservation{}, "", fmt.Errorf("reservation: get: %w", err)
	}
	return fromRow(row.WorkerEndpointOriginReservation, row.EffectiveStatus), row.OwnershipToken, nil
}

// lock reads and locks one reservation for the rest of tx.
func lock(ctx context.Context, tx pgx.Tx, orgID, id string) (Reservation, error) {
	row, err := dbsqlc.New(tx).ReservationLock(ctx, dbsqlc.ReservationLockParams{OrganizationID: orgID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && row.EffectiveStatus == dbsqlc.ReservationStatusReleased) {
		return Reservation{}, apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: lock: %w", err)
	}
	return fromRow(row.WorkerEndpointOriginReservation, row.EffectiveStatus), nil
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
	if err := checkHeld(ctx, tx, d); err != nil {
		return Reservation{}, err
	}
	if err := checkDomain(ctx, tx, org.ID, &d, true); err != nil {
		return Reservation{}, err
	}
	// The organization's reservation ceiling (SPEC 5.1), held until this transaction ends, the lazy
	// expiry of what the new row could conflict with, and the insert, in one round trip. A refusal
	// of the quota step ends the transaction, and the sweep and insert with it.
	params := dbsqlc.ReservationCreateParams{
		OrganizationID: org.ID, ID: id, UID: uuid.Must(uuid.NewV7()), Space: d.space, WorkerName: d.workerName,
		Subdomain: d.subdomain, CanonicalOrigin: d.origin, TTLSeconds: int32(d.ttl),
		OfferingID: d.offering.ID, OfferingDigest: d.offering.Digest, Pack: d.offering.Pack, Installation: d.inst.Name,
	}
	if d.hostname != "" {
		params.Hostname, params.CustomDomain = &d.hostname, &d.customDomain
	}
	var row dbsqlc.WorkerEndpointOriginReservation
	err = store.Pipeline(ctx, tx,
		func(db store.DBTX) error { return quota.Check(ctx, db, s.Catalog.Quotas, org.ID, quota.Reservations) },
		func(db store.DBTX) error {
			return sweep(ctx, dbsqlc.New(db), org.ID, id, d.space, d.workerName, d.origin)
		},
		func(db store.DBTX) (err error) {
			// A unique index refusing the insert refuses the request: the transaction ends with it.
			row, err = dbsqlc.New(db).ReservationCreate(ctx, params)
			return err
		})
	switch {
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_origin_key"):
		return Reservation{}, apierr.New(apierr.OriginTaken, "origin %s is held by another reservation", d.origin).
			With("canonicalOrigin", d.origin)
	case store.IsUniqueViolation(err, "worker_endpoint_origin_reservations_worker_key"):
		return Reservation{}, apierr.New(apierr.ReservationConflict, "another reservation already holds worker %s/%s", d.space, d.workerName)
	case errors.Is(err, pgx.ErrNoRows):
		return Reservation{}, apierr.New(apierr.ReservationConflict, "reservation %q already exists and still holds its origin (or is a migrated v1 row); release it first or choose another id", id)
	case err != nil:
		if _, ok := apierr.As(err); ok {
			return Reservation{}, err // the quota's refusal
		}
		return Reservation{}, fmt.Errorf("reservation: create: %w", err)
	}
	return fromRow(row, ""), nil
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
	r, err := lock(ctx, tx, org.ID, id)
	if err != nil {
		return Reservation{}, err
	}
	var diffs []string
	if r.Space != d.space || r.WorkerName != d.workerName {
		diffs = append(diffs, "space/workerName")
	}
	switch {
	case deref(r.Hostname) != d.hostname:
		diffs = append(diffs, "hostname")
	case r.Subdomain != d.subdomain || r.CanonicalOrigin != d.origin:
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

// Release lets go of a reservation under the four fences of SPEC 3.3, in one statement on the
// locked row; releasing a released one succeeds (release is idempotent once terminal).
func (s *Service) Release(ctx context.Context, tx pgx.Tx, org auth.Organization, id string, uid uuid.UUID) (Reservation, error) {
	if err := CheckID(id); err != nil {
		return Reservation{}, err
	}
	return release(ctx, tx, org.ID, id, uid)
}

func release(ctx context.Context, tx pgx.Tx, orgID, id string, uid uuid.UUID) (Reservation, error) {
	q := dbsqlc.New(tx)
	row, err := q.ReservationLock(ctx, dbsqlc.ReservationLockParams{OrganizationID: orgID, ID: id})
	if errors.Is(err, pgx.ErrNoRows) {
		return Reservation{}, apierr.New(apierr.NotFound, "no reservation %q", id)
	}
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: release: %w", err)
	}
	current := fromRow(row.WorkerEndpointOriginReservation, row.EffectiveStatus)
	switch {
	case current.UID != uid:
		return Reservation{}, apierr.New(apierr.NotFound, "no reservation %q", id)
	case current.Status == dbsqlc.ReservationStatusReleased:
		return current, nil // release is idempotent once terminal
	}
	if current.Format != FormatV2 {
		return Reservation{}, apierr.New(apierr.ReservationMismatch, "reservation %q is a migrated %s row; it is readable and never written", id, current.Format)
	}
	f, err := q.ReservationRelease(ctx, dbsqlc.ReservationReleaseParams{OrganizationID: orgID, ID: id, UID: uid})
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: release: %w", err)
	}
	if !f.Released {
		return Reservation{}, fenced(id, b(f.Activation), b(f.LeaseClaimed), b(f.EndpointPresent), b(f.AttestationOpen), b(f.DeploymentLive))
	}
	row2, err := q.ReservationRead(ctx, dbsqlc.ReservationReadParams{OwnershipKind: Kind, OrganizationID: orgID, ID: id})
	if err != nil {
		return Reservation{}, fmt.Errorf("reservation: release: %w", err)
	}
	return fromRow(row2.WorkerEndpointOriginReservation, row2.EffectiveStatus), nil
}

func b(v *bool) bool { return v != nil && *v }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Derivation is the answer of the non-mutating derivation route (SPEC 3.1).
// Its HeldBy says who holds an origin that is not available, as far as the caller may know: its
// own organization's reservation or endpoint by name, or another organization by nothing more.
type Derivation = apitypes.Derivation

// Holder is who holds an unavailable origin: Organization "self" or "other"; Kind "reservation"
// or "endpoint" and Name its id, or space/name, when it is the caller's own.
type Holder = apitypes.Holder

// holder names who holds an unavailable origin: the caller's own reservation or endpoint, or
// another organization. Freed between the reads, it says nothing rather than guess.
func holder(ctx context.Context, q *dbsqlc.Queries, org, origin, reservationID string, req DerivationRequest) (*Holder, error) {
	r, err := q.ReservationOriginHoldingReservation(ctx, dbsqlc.ReservationOriginHoldingReservationParams{
		CanonicalOrigin: origin, OrganizationID: org, ReservationID: reservationID, Space: req.Space, WorkerName: req.WorkerName,
	})
	switch {
	case err == nil && r.OrganizationID == org:
		return &Holder{Organization: "self", Kind: "reservation", Name: r.ID}, nil
	case err == nil:
		return &Holder{Organization: "other"}, nil
	case !errors.Is(err, pgx.ErrNoRows):
		return nil, fmt.Errorf("reservation: origin holder: %w", err)
	}
	e, err := q.ReservationOriginHoldingEndpoint(ctx, dbsqlc.ReservationOriginHoldingEndpointParams{
		CanonicalOrigin: origin, OrganizationID: org, ReservationID: reservationID, Space: req.Space, WorkerName: req.WorkerName,
	})
	switch {
	case err == nil && e.OrganizationID == org:
		return &Holder{Organization: "self", Kind: "endpoint", Name: e.Space + "/" + e.Name}, nil
	case err == nil:
		return &Holder{Organization: "other"}, nil
	case errors.Is(err, pgx.ErrNoRows):
		return nil, nil
	}
	return nil, fmt.Errorf("reservation: origin holder: %w", err)
}

// DerivationRequest is the body of POST /v1/worker-endpoint-origin-derivations.
type DerivationRequest = apitypes.DerivationRequest

// Derive answers what a reservation PUT would hold, through the same resolution as the real PUT,
// and whether that origin is free for the caller. It takes no lock and writes nothing.
func (s *Service) Derive(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, req DerivationRequest) (Derivation, error) {
	reservationID := ""
	if req.OriginReservationID != nil {
		if err := CheckReadableID(*req.OriginReservationID); err != nil {
			return Derivation{}, apierr.New(apierr.InvalidRequest, "originReservationId %q is not a reservation id", *req.OriginReservationID)
		}
		reservationID = *req.OriginReservationID
	}
	d, err := s.resolve(org, Request{Space: req.Space, WorkerName: req.WorkerName, Subdomain: req.Subdomain, Hostname: req.Hostname, OfferingID: req.OfferingID})
	if err != nil {
		return Derivation{}, err
	}
	if err := checkHeld(ctx, db, d); err != nil {
		return Derivation{}, err
	}
	if err := checkDomain(ctx, db, org.ID, &d, false); err != nil {
		return Derivation{}, err
	}
	out := Derivation{OfferingID: d.offering.ID, CanonicalOrigin: d.origin, Subdomain: d.subdomain}
	if label, ok := d.backend.HostMintedSubdomain(backend.WorkerRef{TenantRef: org.ID, Space: req.Space, Name: req.WorkerName}); ok {
		out.HostMintedSubdomain = &label
	}
	out.Available, err = dbsqlc.New(db).ReservationOriginAvailable(ctx, dbsqlc.ReservationOriginAvailableParams{
		CanonicalOrigin: d.origin, OrganizationID: org.ID, ReservationID: reservationID, Space: req.Space, WorkerName: req.WorkerName,
	})
	if err != nil {
		return Derivation{}, fmt.Errorf("reservation: availability: %w", err)
	}
	if !out.Available {
		if out.HeldBy, err = holder(ctx, dbsqlc.New(db), org.ID, d.origin, reservationID, req); err != nil {
			return Derivation{}, err
		}
	}
	return out, nil
}
