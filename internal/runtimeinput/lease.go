package runtimeinput

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// Consumer is the worker incarnation consuming a runtime input: proved Ready at its current
// generation, with its script name, required sensitive vars and installation.
type Consumer struct {
	Incarnation  reservation.WorkerIncarnation
	ScriptName   string
	Required     []string
	Installation catalog.Installation
}

// Hooks lets tests stop a consumption at a precise point, as a crash would.
type Hooks struct {
	// AfterAcquire runs after the claim committed.
	AfterAcquire func()
	// BeforeDelivery runs right before the backend call (tests count deliveries with it).
	BeforeDelivery func()
	// AfterDispatchCommit runs after the dispatch CAS committed and before the backend call; an
	// error stops the consumption there.
	AfterDispatchCommit func() error
	// AfterDelivery runs after the backend applied the values and before the settle; an error
	// stops the consumption there (an acknowledgement lost).
	AfterDelivery func() error
}

// Consume runs the lease for the runtime input the worker names: bind the reservation to the
// exact Ready worker, acquire, dispatch (clearing the ciphertext in the same CAS), deliver, and
// settle on a matching readback digest (SPEC 3.5). It returns the lease's final status.
func (s *Service) Consume(ctx context.Context, m *ownership.Mutation, c Consumer, reference string, hooks Hooks) (string, error) {
	if _, err := s.ring(); err != nil {
		return "", err
	}
	prepID, ok := parseReference(reference)
	if !ok {
		return "", apierr.New(apierr.ReferenceMismatch, "runtimeInputReference %q is not a well-formed reference", reference)
	}
	// Fail before claiming anything when the backend cannot receive the values.
	if _, err := s.Backends.SecretSink(c.Installation); errors.Is(err, backend.ErrNotImplemented) {
		return "", apierr.New(apierr.NotImplemented, "the %s backend cannot receive runtime inputs yet", c.Installation.Pack)
	} else if err != nil {
		return "", err
	}
	org := c.Incarnation.OrganizationID
	// Expiry is lazy: sweep in a transaction of its own, so it stands even when the claim below
	// is refused.
	if err := m.Tx(ctx, func(tx pgx.Tx) error { return sweep(ctx, tx, org) }); err != nil {
		return "", err
	}
	var p Preparation
	var epoch int64
	done := false
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		if p, err = load(ctx, tx, org, nil, prepID); err != nil {
			if apierr.Is(err, apierr.NotFound) {
				return apierr.New(apierr.ReferenceMismatch, "no runtime input is prepared for reference %s", reference)
			}
			return err
		}
		if p.Reference != reference {
			return apierr.New(apierr.ReferenceMismatch, "runtime input %s has another reference", prepID)
		}
		if p.Target.Space != c.Incarnation.Space || p.Target.WorkerName != c.Incarnation.Name {
			return apierr.New(apierr.TargetMismatch, "runtime input %s targets worker %s/%s, not %s/%s", prepID, p.Target.Space, p.Target.WorkerName, c.Incarnation.Space, c.Incarnation.Name)
		}
		for _, v := range c.Required {
			if !slices.Contains(p.BindingNames, v) {
				return apierr.New(apierr.TargetMismatch, "runtime input %s has no binding for required sensitive var %s", prepID, v)
			}
		}
		switch {
		case p.Status == "settled" && p.WorkerUID != nil && *p.WorkerUID == c.Incarnation.UID:
			done = true
			return nil
		case p.Status == "prepared", p.Status == "claimed" && p.WorkerUID != nil && *p.WorkerUID == c.Incarnation.UID:
		case p.Status == "dispatched":
			return apierr.New(apierr.IntentInProgress, "runtime input %s is being delivered; retry", prepID)
		default:
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s is %s; prepare a new one (a new material set nonce)", prepID, p.Status)
		}
		// Bind the reservation to this exact worker first: acquisition requires it.
		if _, err := s.Reservations.Bind(ctx, tx, p.Target.OriginReservationID, c.Incarnation); err != nil {
			return err
		}
		err = tx.QueryRow(ctx, store.Q("PreparationAcquire"), pgx.NamedArgs{
			"organization_id": org, "operation_id": p.OperationID, "epoch": p.Epoch, "reference": reference,
			"space": c.Incarnation.Space, "worker_name": c.Incarnation.Name, "claim_operation_id": m.Operation,
			"worker_uid": c.Incarnation.UID, "worker_revision": c.Incarnation.Revision, "native_name": c.ScriptName,
		}).Scan(&epoch)
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s could not be claimed for this worker", prepID)
		}
		return err
	})
	if err != nil || done {
		return p.Status, err
	}

	if hooks.AfterAcquire != nil {
		hooks.AfterAcquire()
	}
	return s.Dispatch(ctx, m, c, p.OperationID, epoch, hooks)
}

// Txer runs a transaction; an ownership.Mutation is one.
type Txer interface {
	Tx(ctx context.Context, fn func(pgx.Tx) error) error
}

// Dispatch carries a claimed lease through: open the sealed material, clear it in the CAS that
// authorizes delivery, deliver once, and settle on a matching readback digest. Of several Hosts
// racing to dispatch one claim, the CAS lets exactly one deliver.
func (s *Service) Dispatch(ctx context.Context, m Txer, c Consumer, operationID string, epoch int64, hooks Hooks) (string, error) {
	ring, err := s.ring()
	if err != nil {
		return "", err
	}
	sink, err := s.Backends.SecretSink(c.Installation)
	if err != nil {
		return "", err
	}
	org := c.Incarnation.OrganizationID
	var p Preparation
	if err := m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		p, err = load(ctx, tx, org, &operationID, "")
		return err
	}); err != nil {
		return "", err
	}
	prepID := p.PreparationID
	// Dispatch: open the sealed material, then clear it in the CAS that authorizes delivery.
	var values map[string]sealing.Secret
	var unreadable error
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		var sealed sealing.Sealed
		if err := tx.QueryRow(ctx, store.Q("PreparationSealed"), pgx.NamedArgs{"organization_id": org, "operation_id": p.OperationID}).
			Scan(&sealed.KeyID, &sealed.Nonce, &sealed.Ciphertext); err != nil {
			return fmt.Errorf("runtime input: read sealed material: %w", err)
		}
		plain, err := ring.Open(sealed, aad(org, p.PreparationID, p.Reference))
		if err == nil {
			values, err = decodeMaterial(plain)
		}
		if err != nil {
			unreadable = err
			return errUnreadable
		}
		var next int64
		err = tx.QueryRow(ctx, store.Q("PreparationDispatch"), pgx.NamedArgs{"organization_id": org, "operation_id": p.OperationID, "epoch": epoch}).
			Scan(&sealed.KeyID, &sealed.Nonce, &sealed.Ciphertext, &next)
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s: the worker, its reservation or its placement changed after the claim (or the claim expired); apply again", prepID)
		}
		epoch = next
		return err
	})
	if errors.Is(err, errUnreadable) {
		// Fail closed, once: the row can never be claimed again.
		_ = m.Tx(context.WithoutCancel(ctx), func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, store.Q("PreparationFail"), pgx.NamedArgs{"organization_id": org, "operation_id": p.OperationID, "failure": "sealed material unreadable"})
			return err
		})
		reason := "corrupt or moved"
		if errors.Is(unreadable, sealing.ErrUnknownKey) {
			reason = "sealed under a retired key"
		}
		return "failed", apierr.New(apierr.SealedMaterial, "runtime input %s cannot be opened (%s); it fails closed: prepare a new one", prepID, reason)
	}
	if err != nil {
		return "", err
	}
	if hooks.AfterDispatchCommit != nil {
		if err := hooks.AfterDispatchCommit(); err != nil {
			return "dispatched", err
		}
	}
	if hooks.BeforeDelivery != nil {
		hooks.BeforeDelivery()
	}
	// Whether a failed delivery landed anything is for the readback to say.
	deliverErr := sink.DeliverSecrets(ctx, c.ScriptName, values)
	if hooks.AfterDelivery != nil {
		if err := hooks.AfterDelivery(); err != nil {
			return "dispatched", err
		}
	}
	var status string
	err = m.Tx(context.WithoutCancel(ctx), func(tx pgx.Tx) error {
		var err error
		status, err = s.settle(ctx, tx, sink, org, p.OperationID, epoch, p.DigestKeyID, p.MaterialDigest, c.ScriptName)
		return err
	})
	if err == nil && status != "settled" {
		why := "its readback does not match what was sealed"
		if deliverErr != nil {
			why = "the delivery failed"
		}
		err = apierr.New(apierr.BackendFailed, "runtime input %s was not delivered (%s); it fails closed: prepare a new one", prepID, why)
	}
	return status, err
}

var errUnreadable = errors.New("sealed material unreadable")

func decodeMaterial(plain []byte) (map[string]sealing.Secret, error) {
	var m map[string]string
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, err
	}
	out := make(map[string]sealing.Secret, len(m))
	for k, v := range m {
		out[k] = sealing.NewSecret(v)
	}
	return out, nil
}

// settle compares the keyed digest of the backend's readback with the sealed material's and
// settles on a match, or fails the lease. It never delivers anything.
func (s *Service) settle(ctx context.Context, tx pgx.Tx, sink backend.SecretSink, org, operationID string, epoch int64, digestKeyID string, want []byte, scriptName string) (string, error) {
	got, present, err := sink.ReadSecrets(ctx, scriptName)
	if err != nil {
		return "", fmt.Errorf("runtime input: read back: %w", err)
	}
	var digest []byte
	if present {
		if digest, err = s.Ring.Digest(digestKeyID, material(got)); err != nil {
			digest = nil
		}
	}
	if digest != nil {
		var next int64
		err := tx.QueryRow(ctx, store.Q("PreparationSettle"), pgx.NamedArgs{"organization_id": org, "operation_id": operationID, "epoch": epoch, "readback_digest": digest}).Scan(&next)
		if err == nil {
			return "settled", nil
		}
		if !errors.Is(err, pgx.ErrNoRows) {
			return "", fmt.Errorf("runtime input: settle: %w", err)
		}
	}
	if _, err := tx.Exec(ctx, store.Q("PreparationFail"), pgx.NamedArgs{"organization_id": org, "operation_id": operationID, "failure": "readback does not match the sealed material"}); err != nil {
		return "", fmt.Errorf("runtime input: fail: %w", err)
	}
	return "failed", nil
}

// RecoverLeases settles, by readback only, the leases an interrupted operation dispatched: an
// acknowledgement lost after the backend applied the values settles; anything else fails. It
// never dispatches again, returns values, or reads a reservation or endpoint.
func (s *Service) RecoverLeases(ctx context.Context, tx pgx.Tx, catalogInstallations map[string]catalog.Installation, op uuid.UUID) error {
	rows, err := tx.Query(ctx, store.Q("PreparationsDispatchedByOperation"), pgx.NamedArgs{"claim_operation_id": op})
	if err != nil {
		return fmt.Errorf("runtime input: recover: %w", err)
	}
	type lease struct {
		org, operationID, digestKeyID string
		epoch                         int64
		digest                        []byte
		native, installation          *string
	}
	var leases []lease
	var l lease
	if _, err := pgx.ForEachRow(rows, []any{&l.org, &l.operationID, &l.epoch, &l.digestKeyID, &l.digest, &l.native, &l.installation}, func() error {
		leases = append(leases, l)
		return nil
	}); err != nil {
		return fmt.Errorf("runtime input: recover: %w", err)
	}
	for _, l := range leases {
		inst, ok := catalogInstallations[deref(l.installation)]
		var sink backend.SecretSink
		if ok {
			sink, err = s.Backends.SecretSink(inst)
		}
		if !ok || err != nil || l.native == nil || s.Ring == nil {
			if _, err := tx.Exec(ctx, store.Q("PreparationFail"), pgx.NamedArgs{"organization_id": l.org, "operation_id": l.operationID, "failure": "interrupted; the backend cannot be read back"}); err != nil {
				return err
			}
			continue
		}
		if _, err := s.settle(ctx, tx, sink, l.org, l.operationID, l.epoch, l.digestKeyID, l.digest, *l.native); err != nil {
			return err
		}
	}
	return nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
