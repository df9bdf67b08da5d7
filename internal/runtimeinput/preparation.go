package runtimeinput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// Kind is the ownership kind of preparations; ResourceType the provider resource that holds them.
const (
	Kind         = "worker-runtime-input-preparation"
	ResourceType = "takoform_worker_runtime_input"
	// ProjectionFormat names the projection of a preparation.
	ProjectionFormat = "takoserver.worker-runtime-input-preparation.v1"
)

// Bounds on a preparation.
const (
	maxBindings   = 64
	maxValueBytes = 64 << 10
)

// wellFormed reports whether a reference is a rip1 or rip2 one.
func wellFormed(reference string) bool {
	_, ok := runtimeref.Parse(reference)
	return ok
}

// CheckOperationID refuses an operation id that cannot name a preparation.
func CheckOperationID(id string) error {
	if !vocab.OperationID.MatchString(id) {
		return apierr.New(apierr.InvalidRequest, "operation id %q must match %s", id, vocab.OperationIDPattern)
	}
	return nil
}

// TargetRequest is the target a caller names; the origin is not part of it.
type TargetRequest = apitypes.PreparationTarget

// Request is the body of PUT .../worker-runtime-input-preparations/{operationId}, as the document
// types it. Its binding values are plain strings only between the decoder and Put, which wraps
// them at once (inputOf).
type Request = apitypes.PreparationRequest

// input is a Request with its values wrapped, so that no log or error can print them: what a
// preparation is sealed from.
type input struct {
	Request // Bindings nil: the values are in Values
	// Values are the bindings' values, wrapped. Exported, so that fmt formats them as Secrets.
	Values map[string]vocab.Secret
}

// inputOf wraps req's values; the input holds no plain copy of them. The caller's map is left as
// it is: the ownership loop may run Put again with the same request (a retry after a busy key).
func inputOf(req Request) input {
	bindings := make(map[string]vocab.Secret, len(req.Bindings))
	for name, v := range req.Bindings {
		bindings[name] = vocab.NewSecret(v)
	}
	req.Bindings = nil
	return input{Request: req, Values: bindings}
}

// HashBody is the body the ownership request hash is taken over: the request with every binding
// value blanked. The reference already commits to the values, and no digest of a secret that
// could be guessed offline is stored anywhere.
func HashBody(raw []byte) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if b, ok := m["bindings"].(map[string]any); ok {
		for k := range b {
			b[k] = ""
		}
	}
	return json.Marshal(m)
}

// Preparation is one stored row, value-free, its Status as of database time.
type Preparation struct {
	dbsqlc.PreparationGetRow
}

// TargetView is a target in a projection, with the origin the Host took from the reservation.
type TargetView = apitypes.PreparationTargetView

// ObjectRef is a {uid, revision} pair in a projection.
type ObjectRef = apitypes.ObjectRef

// Projection is the public view of a preparation (SPEC 3.5), names, never values: the document's
// Preparation (api/apitypes), with the bytes a response carries.
type Projection apitypes.Preparation

// Project renders p with its ownership token.
func (p Preparation) Project(token string) Projection {
	expires := p.ExpiresAt
	if p.Status == dbsqlc.RuntimeInputStatusClaimed && p.ClaimExpiresAt != nil {
		expires = *p.ClaimExpiresAt
	}
	out := Projection{
		Format: ProjectionFormat, OperationID: p.OperationID, PreparationID: p.PreparationID,
		RuntimeInputReference: p.Reference, MaterialSetNonce: p.MaterialSetNonce,
		Target: TargetView{Space: p.Space, WorkerName: p.WorkerName, BundleName: p.BundleName,
			EndpointName: p.EndpointName, OriginReservationID: p.OriginReservationID, CanonicalPublicOrigin: p.CanonicalPublicOrigin},
		BindingNames: p.BindingNames, Status: string(p.Status), ExpiresAt: expires.UTC().Format(time.RFC3339), Failure: p.Failure,
	}
	if out.BindingNames == nil {
		out.BindingNames = []string{}
	}
	if p.WorkerUID != nil && p.WorkerRevision != nil {
		out.BoundWorker = &ObjectRef{UID: p.WorkerUID.String(), Revision: *p.WorkerRevision}
	}
	if token != "" {
		out.OwnershipToken = &token
	}
	return out
}

// JSON is the projection's bytes.
func (p Projection) JSON() []byte { return wire.JSON(p) }

// Service is the runtime-input authority.
type Service struct {
	// Quotas are the default ceilings (the catalog's); an organization's overrides are stored.
	Quotas       quota.Ceilings
	Ring         *sealing.Ring
	Backends     *backend.Registry
	Reservations *reservation.Service
}

func (s *Service) ring() (*sealing.Ring, error) {
	if s.Ring == nil {
		return nil, apierr.New(apierr.NotImplemented, "this Host has no sealing key ring configured")
	}
	return s.Ring, nil
}

// get reads one preparation as of database time, with the owning token of its ownership key.
func get(ctx context.Context, db dbsqlc.DBTX, org string, params dbsqlc.PreparationGetParams) (Preparation, string, error) {
	params.OrganizationID, params.OwnershipKind = org, Kind
	row, err := dbsqlc.New(db).PreparationGet(ctx, params)
	if errors.Is(err, pgx.ErrNoRows) {
		return Preparation{}, "", apierr.New(apierr.NotFound, "no runtime-input preparation %s", firstOf(params.OperationID, params.PreparationID, params.Reference))
	}
	if err != nil {
		return Preparation{}, "", fmt.Errorf("runtime input: get: %w", err)
	}
	return Preparation{row}, row.OwnershipToken, nil
}

func firstOf(vals ...*string) string {
	for _, v := range vals {
		if v != nil {
			return *v
		}
	}
	return ""
}

// Get reads one preparation of the organization by operation id, and the owning token of its
// ownership key, writing nothing.
func (s *Service) Get(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, operationID string) (Preparation, string, error) {
	if err := CheckOperationID(operationID); err != nil {
		return Preparation{}, "", apierr.New(apierr.NotFound, "no runtime-input preparation %q", operationID)
	}
	return get(ctx, db, org.ID, dbsqlc.PreparationGetParams{OperationID: &operationID})
}

// GetByReference reads the preparation a reference names, within the organization only (a
// reference is not a bearer credential), and the owning token of its ownership key, writing
// nothing.
func (s *Service) GetByReference(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, reference string) (Preparation, string, error) {
	if !wellFormed(reference) {
		return Preparation{}, "", apierr.New(apierr.NotFound, "no runtime input with reference %q", reference)
	}
	return get(ctx, db, org.ID, dbsqlc.PreparationGetParams{Reference: &reference})
}

// lock sweeps the row's expiry, then reads and locks it.
func lock(ctx context.Context, tx pgx.Tx, org string, operationID, preparationID *string) (dbsqlc.PreparationLockRow, error) {
	q := dbsqlc.New(tx)
	if operationID != nil {
		if err := q.PreparationSweep(ctx, dbsqlc.PreparationSweepParams{OrganizationID: org, OperationID: *operationID}); err != nil {
			return dbsqlc.PreparationLockRow{}, fmt.Errorf("runtime input: sweep: %w", err)
		}
	}
	row, err := q.PreparationLock(ctx, dbsqlc.PreparationLockParams{OrganizationID: org, OperationID: operationID, PreparationID: preparationID})
	if errors.Is(err, pgx.ErrNoRows) {
		return row, apierr.New(apierr.NotFound, "no runtime-input preparation %s", firstOf(operationID, preparationID))
	}
	if err != nil {
		return row, fmt.Errorf("runtime input: lock: %w", err)
	}
	if operationID == nil {
		if err := q.PreparationSweep(ctx, dbsqlc.PreparationSweepParams{OrganizationID: org, OperationID: row.OperationID}); err != nil {
			return row, fmt.Errorf("runtime input: sweep: %w", err)
		}
		return q.PreparationLock(ctx, dbsqlc.PreparationLockParams{OrganizationID: org, OperationID: &row.OperationID})
	}
	return row, nil
}

func (s *Service) validate(req input) error {
	switch {
	case req.Format != PreparationFormat:
		return apierr.New(apierr.InvalidRequest, "format must be %q", PreparationFormat)
	case checkNonce(req.MaterialSetNonce) != nil:
		return checkNonce(req.MaterialSetNonce)
	case !wellFormed(req.RuntimeInputReference):
		return apierr.New(apierr.InvalidRequest, "runtimeInputReference must look like rip2.<commitment secret id>.prep-<32 hex>.<64 hex> (or, from older providers, rip1.prep-<32 hex>.<64 hex>)")
	case !vocab.Name.MatchString(req.Target.Space), !vocab.Name.MatchString(req.Target.WorkerName),
		!vocab.Name.MatchString(req.Target.BundleName), !vocab.Name.MatchString(req.Target.EndpointName):
		return apierr.New(apierr.InvalidRequest, "target space, workerName, bundleName and endpointName must each match %s", vocab.NamePattern)
	case len(req.Values) > maxBindings:
		return apierr.New(apierr.InvalidRequest, "at most %d bindings", maxBindings)
	}
	if err := reservation.CheckID(req.Target.OriginReservationID); err != nil {
		return err
	}
	for name, v := range req.Values {
		if !vocab.BindingName.MatchString(name) {
			return apierr.New(apierr.InvalidRequest, "binding name %q must match %s", name, vocab.BindingNamePattern)
		}
		if len(v.Reveal()) > maxValueBytes {
			return apierr.New(apierr.InvalidRequest, "binding %s is larger than %d bytes", name, maxValueBytes)
		}
	}
	return nil
}

// material is the canonical JSON of the bindings: what is sealed, and what the readback digest
// is taken over.
func material(bindings map[string]vocab.Secret) []byte {
	return canonjson.Marshal(reveal(bindings))
}

// aad binds a ciphertext to its row: opened anywhere else, it fails.
func aad(org, preparationID, reference string) []byte {
	return canonjson.Marshal(canonjson.Object{
		{Key: "format", Value: "takoserver.runtime-input-seal.v1"},
		{Key: "organizationId", Value: org},
		{Key: "preparationId", Value: preparationID},
		{Key: "reference", Value: reference},
	})
}

// prepare seals a new preparation. The canonical origin is taken only from the live same-org
// reservation the target names; the reference is recomputed and must match (SPEC 3.5). Only the
// readback digest under a challenge derived from the ring (and never stored) is kept beside the
// ciphertext.
func (s *Service) prepare(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string, req input) (Preparation, error) {
	if err := CheckOperationID(operationID); err != nil {
		return Preparation{}, err
	}
	if err := s.validate(req); err != nil {
		return Preparation{}, err
	}
	ring, err := s.ring()
	if err != nil {
		return Preparation{}, err
	}
	// The organization's ceiling on pending runtime inputs (SPEC 5.1), held until this
	// transaction ends.
	if err := quota.Check(ctx, tx, s.Quotas, org.ID, quota.RuntimeInputs); err != nil {
		return Preparation{}, err
	}
	r, _, err := s.Reservations.Get(ctx, tx, org, req.Target.OriginReservationID)
	if err != nil {
		return Preparation{}, err
	}
	if !r.Live() {
		return Preparation{}, apierr.New(apierr.ReservationNotLive, "reservation %q is %s", r.ID, r.Status)
	}
	if r.Space != req.Target.Space || r.WorkerName != req.Target.WorkerName {
		return Preparation{}, apierr.New(apierr.TargetMismatch, "reservation %q holds worker %s/%s, not %s/%s", r.ID, r.Space, r.WorkerName, req.Target.Space, req.Target.WorkerName)
	}
	target := Target{Space: req.Target.Space, WorkerName: req.Target.WorkerName, BundleName: req.Target.BundleName,
		EndpointName: req.Target.EndpointName, OriginReservationID: r.ID, CanonicalPublicOrigin: r.CanonicalOrigin}
	id, err := s.derive(ctx, tx, ring, org.ID, req.MaterialSetNonce, target, req.Values, req.RuntimeInputReference)
	if err != nil {
		return Preparation{}, err
	}
	if id.Reference != req.RuntimeInputReference {
		return Preparation{}, apierr.New(apierr.ReferenceMismatch,
			"runtimeInputReference does not match the nonce, target and bindings as the Host computes them with canonical origin %s (taken from reservation %q)", r.CanonicalOrigin, r.ID)
	}
	plain := material(req.Values)
	sealed, err := ring.Seal(ctx, tx, plain, aad(org.ID, id.PreparationID, id.Reference))
	if err != nil {
		return Preparation{}, fmt.Errorf("runtime input: seal: %w", err)
	}
	materialSetID := uuid.New()
	challenge, err := ring.Challenge(ctx, tx, sealed.KeyID, id.PreparationID, materialSetID)
	if err != nil {
		return Preparation{}, fmt.Errorf("runtime input: challenge: %w", err)
	}
	names := make([]string, 0, len(req.Values))
	for n := range req.Values {
		names = append(names, n)
	}
	slices.Sort(names)
	err = dbsqlc.New(tx).PreparationInsert(ctx, dbsqlc.PreparationInsertParams{
		OrganizationID: org.ID, OperationID: operationID, PreparationID: id.PreparationID, Reference: id.Reference,
		MaterialSetNonce: req.MaterialSetNonce, MaterialSetID: materialSetID, Space: target.Space, WorkerName: target.WorkerName,
		BundleName: target.BundleName, EndpointName: target.EndpointName, OriginReservationID: target.OriginReservationID,
		CanonicalPublicOrigin: target.CanonicalPublicOrigin, BindingNames: names, SealingKeyID: &sealed.KeyID,
		SealingNonce: sealed.Nonce, Ciphertext: sealed.Ciphertext, MaterialDigest: sealing.Digest(challenge, plain), DigestKeyID: sealed.KeyID,
	})
	if err != nil {
		if store.IsUniqueViolation(err, "") {
			return Preparation{}, apierr.New(apierr.ResourceExists, "this material (%s) is already prepared under another operation id", id.PreparationID)
		}
		return Preparation{}, fmt.Errorf("runtime input: prepare: %w", err)
	}
	p, _, err := get(ctx, tx, org.ID, dbsqlc.PreparationGetParams{OperationID: &operationID})
	return p, err
}

// reconcile answers a changed request from the preparation's owner: a preparation never changes,
// so only one that resolves to the same reference succeeds.
func (s *Service) reconcile(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string, req input) (Preparation, error) {
	p, _, err := s.Get(ctx, tx, org, operationID)
	if err != nil {
		return Preparation{}, err
	}
	if p.Reference != req.RuntimeInputReference {
		return Preparation{}, apierr.New(apierr.Immutable, "preparation %s holds reference %s; a runtime input never changes in place: prepare another operation id", operationID, p.Reference)
	}
	return p, nil
}

// Abort ends a preparation (DELETE, SPEC 3.5): a prepared or claimed one is revoked and its
// ciphertext dropped; one in any other state is left as it is (a settled one's values stay with
// its worker on the backend until the worker is deleted or a new delivery replaces them).
func (s *Service) Abort(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string) (Preparation, error) {
	if _, err := lock(ctx, tx, org.ID, &operationID, nil); err != nil {
		return Preparation{}, err
	}
	if _, err := dbsqlc.New(tx).PreparationAbort(ctx, dbsqlc.PreparationAbortParams{OrganizationID: org.ID, OperationID: operationID}); err != nil {
		return Preparation{}, fmt.Errorf("runtime input: abort: %w", err)
	}
	p, _, err := get(ctx, tx, org.ID, dbsqlc.PreparationGetParams{OperationID: &operationID})
	return p, err
}

// parseReference returns the preparation id a reference names.
func parseReference(ref string) (string, bool) {
	p, ok := runtimeref.Parse(ref)
	return p.PreparationID, ok
}

// SweepExpired expires every preparation past its window and drops its sealed material, so that
// no ciphertext outlives it even when nothing touches the row again: the janitor's step, in
// batches (store.Sweep). It reports how many it expired.
func (s *Service) SweepExpired(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return store.Sweep(ctx, dbsqlc.New(db).PreparationSweepAll)
}

// SweepPoolBlobs drops the pool blobs of workers that are gone (SPEC 6.2: a blob is deleted when
// its worker is); it counts the rows it cleared.
func (s *Service) SweepPoolBlobs(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return dbsqlc.New(db).PoolBlobsSweep(ctx)
}
