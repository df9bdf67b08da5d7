package runtimeinput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// Kind is the ownership kind of preparations; ResourceType the provider resource that holds them.
const (
	Kind         = "worker-runtime-input-preparation"
	ResourceType = "takoform_worker_runtime_input"
)

// Bounds on a preparation.
const (
	maxBindings   = 64
	maxValueBytes = 64 << 10
)

var (
	namePattern        = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)
	bindingName        = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	operationIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)
	referencePattern   = regexp.MustCompile(`^rip1\.(prep-[0-9a-f]{32})\.([0-9a-f]{64})$`)
)

// CheckOperationID refuses an operation id that cannot name a preparation.
func CheckOperationID(id string) error {
	if !operationIDPattern.MatchString(id) {
		return apierr.New(apierr.InvalidRequest, "operation id %q must match %s", id, operationIDPattern)
	}
	return nil
}

// TargetRequest is the target a caller names; the origin is not part of it.
type TargetRequest struct {
	Space               string `json:"space"`
	WorkerName          string `json:"workerName"`
	BundleName          string `json:"bundleName"`
	EndpointName        string `json:"endpointName"`
	OriginReservationID string `json:"originReservationId"`
}

// Request is the body of PUT .../worker-runtime-input-preparations/{operationId}.
type Request struct {
	Format                string                    `json:"format"`
	MaterialSetNonce      string                    `json:"materialSetNonce"`
	RuntimeInputReference string                    `json:"runtimeInputReference"`
	Target                TargetRequest             `json:"target"`
	Bindings              map[string]sealing.Secret `json:"bindings"`
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

// Preparation is one stored row, value-free.
type Preparation struct {
	OrganizationID   string
	OperationID      string
	PreparationID    string
	Reference        string
	MaterialSetNonce string
	MaterialSetID    uuid.UUID
	Target           Target
	BindingNames     []string
	Status           string
	Epoch            int64
	ExpiresAt        time.Time
	ClaimExpiresAt   *time.Time
	WorkerUID        *uuid.UUID
	DigestKeyID      string
	MaterialDigest   []byte
}

// TargetView is a target in a projection, with the origin the Host took from the reservation.
type TargetView struct {
	Space                 string `json:"space"`
	WorkerName            string `json:"workerName"`
	BundleName            string `json:"bundleName"`
	EndpointName          string `json:"endpointName"`
	OriginReservationID   string `json:"originReservationId"`
	CanonicalPublicOrigin string `json:"canonicalPublicOrigin"`
}

// Projection is the public view of a preparation: names, never values.
type Projection struct {
	Format                string     `json:"format"`
	OrganizationID        string     `json:"organizationId"`
	OperationID           string     `json:"operationId"`
	PreparationID         string     `json:"preparationId"`
	RuntimeInputReference string     `json:"runtimeInputReference"`
	MaterialSetNonce      string     `json:"materialSetNonce"`
	Target                TargetView `json:"target"`
	BindingNames          []string   `json:"bindingNames"`
	Status                string     `json:"status"`
	ExpiresAt             string     `json:"expiresAt"`
	OwnershipToken        *string    `json:"ownershipToken"`
}

// Project renders p with its ownership token.
func (p Preparation) Project(token string) Projection {
	expires := p.ExpiresAt
	if p.Status == "claimed" && p.ClaimExpiresAt != nil {
		expires = *p.ClaimExpiresAt
	}
	out := Projection{
		Format: PreparationFormat, OrganizationID: p.OrganizationID, OperationID: p.OperationID, PreparationID: p.PreparationID,
		RuntimeInputReference: p.Reference, MaterialSetNonce: p.MaterialSetNonce,
		Target: TargetView{Space: p.Target.Space, WorkerName: p.Target.WorkerName, BundleName: p.Target.BundleName,
			EndpointName: p.Target.EndpointName, OriginReservationID: p.Target.OriginReservationID, CanonicalPublicOrigin: p.Target.CanonicalPublicOrigin},
		BindingNames: p.BindingNames, Status: p.Status, ExpiresAt: expires.UTC().Format(time.RFC3339),
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

func scan(row pgx.Row) (Preparation, error) {
	var p Preparation
	err := row.Scan(&p.OrganizationID, &p.OperationID, &p.PreparationID, &p.Reference, &p.MaterialSetNonce, &p.MaterialSetID,
		&p.Target.Space, &p.Target.WorkerName, &p.Target.BundleName, &p.Target.EndpointName, &p.Target.OriginReservationID,
		&p.Target.CanonicalPublicOrigin, &p.BindingNames, &p.Status, &p.Epoch, &p.ExpiresAt, &p.ClaimExpiresAt,
		&p.WorkerUID, &p.DigestKeyID, &p.MaterialDigest)
	return p, err
}

func sweep(ctx context.Context, tx pgx.Tx, org string) error {
	if _, err := tx.Exec(ctx, store.Q("PreparationSweep"), pgx.NamedArgs{"organization_id": org}); err != nil {
		return fmt.Errorf("runtime input: sweep: %w", err)
	}
	return nil
}

func load(ctx context.Context, tx pgx.Tx, org string, operationID *string, preparationID string) (Preparation, error) {
	if err := sweep(ctx, tx, org); err != nil {
		return Preparation{}, err
	}
	p, err := scan(tx.QueryRow(ctx, store.Q("PreparationSelect"), pgx.NamedArgs{"organization_id": org, "operation_id": operationID, "preparation_id": preparationID}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Preparation{}, apierr.New(apierr.NotFound, "no runtime-input preparation %s", firstNonEmpty(operationID, preparationID))
	}
	if err != nil {
		return Preparation{}, fmt.Errorf("runtime input: load: %w", err)
	}
	return p, nil
}

func firstNonEmpty(a *string, b string) string {
	if a != nil {
		return *a
	}
	return b
}

// Get reads one preparation of the organization.
func (s *Service) Get(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string) (Preparation, error) {
	if err := CheckOperationID(operationID); err != nil {
		return Preparation{}, apierr.New(apierr.NotFound, "no runtime-input preparation %q", operationID)
	}
	return load(ctx, tx, org.ID, &operationID, "")
}

func (s *Service) validate(req Request) error {
	switch {
	case req.Format != PreparationFormat:
		return apierr.New(apierr.InvalidRequest, "format must be %q", PreparationFormat)
	case req.MaterialSetNonce == "" || len(req.MaterialSetNonce) > 256:
		return apierr.New(apierr.InvalidRequest, "materialSetNonce must be 1 to 256 characters")
	case !referencePattern.MatchString(req.RuntimeInputReference):
		return apierr.New(apierr.InvalidRequest, "runtimeInputReference must look like rip1.prep-<32 hex>.<64 hex>")
	case !namePattern.MatchString(req.Target.Space), !namePattern.MatchString(req.Target.WorkerName),
		!namePattern.MatchString(req.Target.BundleName), !namePattern.MatchString(req.Target.EndpointName):
		return apierr.New(apierr.InvalidRequest, "target space, workerName, bundleName and endpointName must each match %s", namePattern)
	case len(req.Bindings) > maxBindings:
		return apierr.New(apierr.InvalidRequest, "at most %d bindings", maxBindings)
	}
	if err := reservation.CheckID(req.Target.OriginReservationID); err != nil {
		return err
	}
	for name, v := range req.Bindings {
		if !bindingName.MatchString(name) {
			return apierr.New(apierr.InvalidRequest, "binding name %q must match %s", name, bindingName)
		}
		if len(v.Reveal()) > maxValueBytes {
			return apierr.New(apierr.InvalidRequest, "binding %s is larger than %d bytes", name, maxValueBytes)
		}
	}
	return nil
}

// material is the canonical JSON of the bindings: what is sealed, and what the readback digest
// is compared over.
func material(bindings map[string]sealing.Secret) []byte {
	plain := make(map[string]string, len(bindings))
	for k, v := range bindings {
		plain[k] = v.Reveal()
	}
	return canonjson.Marshal(plain)
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

// Prepare seals a new preparation. The canonical origin is taken only from the live same-org
// reservation the target names; the reference is recomputed and must match (SPEC 3.5).
func (s *Service) Prepare(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string, req Request) (Preparation, error) {
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
	r, err := s.Reservations.Get(ctx, tx, org, req.Target.OriginReservationID)
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
	id := Derive(req.MaterialSetNonce, target, req.Bindings)
	if id.Reference != req.RuntimeInputReference {
		return Preparation{}, apierr.New(apierr.ReferenceMismatch,
			"runtimeInputReference does not match the nonce, target and bindings as the Host computes them with canonical origin %s (taken from reservation %q)", r.CanonicalOrigin, r.ID)
	}
	plain := material(req.Bindings)
	sealed, err := ring.Seal(plain, aad(org.ID, id.PreparationID, id.Reference))
	if err != nil {
		return Preparation{}, fmt.Errorf("runtime input: seal: %w", err)
	}
	digest, err := ring.Digest(sealed.KeyID, plain)
	if err != nil {
		return Preparation{}, fmt.Errorf("runtime input: digest: %w", err)
	}
	names := make([]string, 0, len(req.Bindings))
	for n := range req.Bindings {
		names = append(names, n)
	}
	slices.Sort(names)
	sp, err := tx.Begin(ctx)
	if err != nil {
		return Preparation{}, err
	}
	_, err = sp.Exec(ctx, store.Q("PreparationInsert"), pgx.NamedArgs{
		"organization_id": org.ID, "operation_id": operationID, "preparation_id": id.PreparationID, "reference": id.Reference,
		"material_set_nonce": req.MaterialSetNonce, "material_set_id": uuid.New(), "space": target.Space, "worker_name": target.WorkerName,
		"bundle_name": target.BundleName, "endpoint_name": target.EndpointName, "origin_reservation_id": target.OriginReservationID,
		"canonical_public_origin": target.CanonicalPublicOrigin, "binding_names": names, "sealing_key_id": sealed.KeyID,
		"sealing_nonce": sealed.Nonce, "ciphertext": sealed.Ciphertext, "material_digest": digest, "digest_key_id": sealed.KeyID,
	})
	if err != nil {
		_ = sp.Rollback(ctx)
		if store.IsUniqueViolation(err, "") {
			return Preparation{}, apierr.New(apierr.ResourceExists, "this material (%s) is already prepared under another operation id", id.PreparationID)
		}
		return Preparation{}, fmt.Errorf("runtime input: prepare: %w", err)
	}
	if err := sp.Commit(ctx); err != nil {
		return Preparation{}, err
	}
	return load(ctx, tx, org.ID, &operationID, "")
}

// Reconcile answers a changed request from the preparation's owner: a preparation never changes,
// so only one that resolves to the same reference succeeds.
func (s *Service) Reconcile(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string, req Request) (Preparation, error) {
	p, err := s.Get(ctx, tx, org, operationID)
	if err != nil {
		return Preparation{}, err
	}
	if p.Reference != req.RuntimeInputReference {
		return Preparation{}, apierr.New(apierr.Immutable, "preparation %s holds reference %s; a runtime input never changes in place: prepare another operation id", operationID, p.Reference)
	}
	return p, nil
}

// Abort revokes a prepared or claimed preparation (DELETE). A terminal one is left as it is.
func (s *Service) Abort(ctx context.Context, tx pgx.Tx, org auth.Organization, operationID string) (Preparation, error) {
	if _, err := s.Get(ctx, tx, org, operationID); err != nil {
		return Preparation{}, err
	}
	if _, err := tx.Exec(ctx, store.Q("PreparationAbort"), pgx.NamedArgs{"organization_id": org.ID, "operation_id": operationID}); err != nil {
		return Preparation{}, fmt.Errorf("runtime input: abort: %w", err)
	}
	return load(ctx, tx, org.ID, &operationID, "")
}

// parseReference returns the preparation id a reference names.
func parseReference(ref string) (string, bool) {
	m := referencePattern.FindStringSubmatch(ref)
	if m == nil || !strings.HasPrefix(m[2], m[1][len("prep-"):]) {
		return "", false
	}
	return m[1], true
}
