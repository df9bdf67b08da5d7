package resource

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Attestation is a deletion attestation's projection (GET /v1/deletion-attestations/{uid}).
type Attestation = apitypes.Attestation

// Attestation reads the organization's deletion attestation uid; another organization's is not
// found.
func (s *Service) Attestation(ctx context.Context, db dbsqlc.DBTX, org string, uid uuid.UUID) (Attestation, error) {
	row, err := dbsqlc.New(db).AttestationGet(ctx, dbsqlc.AttestationGetParams{UID: uid, OrganizationID: org})
	if errors.Is(err, pgx.ErrNoRows) {
		return Attestation{}, apierr.New(apierr.NotFound, "no deletion attestation %s", uid)
	}
	if err != nil {
		return Attestation{}, err
	}
	a := Attestation{UID: row.UID.String(), ResourceKind: string(row.ResourceKind), Status: string(row.Status), OpenedAt: row.OpenedAt.UTC().Format(time.RFC3339)}
	if row.OperationID != nil {
		id := row.OperationID.String()
		a.OperationID = &id
	}
	// A route's attestation closes when its propagation window ends (SPEC 8), which the
	// janitor writes down later: until then the window's end is when it closed.
	if closed := row.ClosedAt; row.Status == dbsqlc.AttestationStatusClosed && (closed != nil || row.ClosesAt != nil) {
		if closed == nil {
			closed = row.ClosesAt
		}
		t := closed.UTC().Format(time.RFC3339)
		a.ClosedAt = &t
	}
	return a, nil
}

// SettleAttestations writes down the close of attestations whose route propagation window has
// passed (every reader already takes them as closed): the janitor's step.
func (s *Service) SettleAttestations(ctx context.Context, db dbsqlc.DBTX) (int64, error) {
	return dbsqlc.New(db).AttestationSettle(ctx)
}

// Operation is an operation's projection (GET /v1/operations/{id}).
type Operation = apitypes.Operation

// Effect is one backend effect of an operation.
type Effect = apitypes.Effect

// Operation reads the organization's operation id with its backend effects; another
// organization's is not found.
func (s *Service) Operation(ctx context.Context, db dbsqlc.DBTX, org string, id uuid.UUID) (Operation, error) {
	q := dbsqlc.New(db)
	row, err := q.OperationGet(ctx, dbsqlc.OperationGetParams{ID: id, OrganizationID: org})
	if errors.Is(err, pgx.ErrNoRows) {
		return Operation{}, apierr.New(apierr.NotFound, "no operation %s", id)
	}
	if err != nil {
		return Operation{}, err
	}
	o := Operation{ID: row.ID.String(), Kind: row.Kind, Key: row.ExternalKey, Method: row.Method, Status: string(row.Status),
		Code: row.Code, Replayed: row.Replayed, StartedAt: row.StartedAt.UTC().Format(time.RFC3339Nano), Effects: []Effect{}}
	if row.FinishedAt != nil {
		t := row.FinishedAt.UTC().Format(time.RFC3339Nano)
		o.FinishedAt = &t
	}
	effects, err := q.OperationEffects(ctx, id)
	if err != nil {
		return Operation{}, err
	}
	for _, e := range effects {
		o.Effects = append(o.Effects, Effect{ID: e.ID.String(), DeploymentID: e.DeploymentID.String(), ResourceKind: string(e.ResourceKind),
			ResourceUID: e.ResourceUID.String(), Action: string(e.Action), Status: string(e.Status), Detail: e.Detail, Node: e.Node})
	}
	return o, nil
}
