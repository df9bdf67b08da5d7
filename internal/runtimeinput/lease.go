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

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// Consumer is the worker incarnation consuming a runtime input: proved Ready at its current
// generation, with its script name, required sensitive vars and installation.
type Consumer struct {
	Incarnation  reservation.WorkerIncarnation
	ScriptName   string
	Required     []string
	Installation catalog.Installation
}

// Hooks lets tests stop a consumption at a precise point.
type Hooks struct {
	// AfterAcquire runs after the claim committed.
	AfterAcquire func()
	// BeforeDelivery runs right before the backend call (tests count deliveries with it).
	BeforeDelivery func()
	// AfterDispatchCommit runs after the dispatch CAS committed and before the backend call; an
	// error stops the consumption there.
	AfterDispatchCommit func() error
	// AfterDelivery runs after the backend applied the values and before the readback; an error
	// stops the consumption there (an acknowledgement lost).
	AfterDelivery func() error
}

// failedDetail is what a lease that cannot be settled tells its owner.
const failedDetail = "the delivery could not be confirmed; this runtime input can never be delivered again: bump bindings_wo_version to prepare a new one"

// Consume runs the lease for the runtime input the worker names up to the readback (SPEC 3.5):
// bind the reservation to the exact worker and acquire (one transaction), open the sealed material
// and dispatch, clearing the ciphertext in the same compare-and-swap (one transaction), deliver
// (one backend call), and ask the backend the readback challenge (one backend call). It returns
// the settle, which the worker's commit transaction runs, so that the worker and its delivery
// commit together. A runtime input already settled for this worker returns a nil settle.
func (s *Service) Consume(ctx context.Context, m *ownership.Mutation, c Consumer, reference string, hooks Hooks) (func(context.Context, pgx.Tx) error, error) {
	ring, err := s.ring()
	if err != nil {
		return nil, err
	}
	prepID, ok := parseReference(reference)
	if !ok {
		return nil, apierr.New(apierr.ReferenceMismatch, "runtimeInputReference %q is not a well-formed reference", reference)
	}
	// Fail before claiming anything when the backend cannot receive the values.
	sink, err := s.Backends.SecretSink(c.Installation)
	if errors.Is(err, backend.ErrNotImplemented) {
		return nil, apierr.New(apierr.NotImplemented, "the %s backend cannot receive runtime inputs yet", c.Installation.Pack)
	} else if err != nil {
		return nil, err
	}
	// A backend that limits its API calls takes the delivery's budget before anything is claimed:
	// while it cannot call, the consumption is refused, retryably, holding nothing (SPEC 8).
	if b, ok := sink.(backend.DeliveryBudget); ok {
		if err := b.ReserveDelivery(ctx); err != nil {
			return nil, backendCallRefused(err)
		}
	}
	if chk, ok := sink.(backend.DeliveryCheck); ok {
		if err := chk.CheckDelivery(ctx); err != nil {
			return nil, backendCallRefused(err)
		}
	}
	// Expiry is lazy: it is swept in a transaction of its own, so that it stands even when the
	// claim below is refused.
	if err := m.Tx(ctx, func(tx pgx.Tx) error {
		_, err := lock(ctx, tx, c.Incarnation.OrganizationID, nil, &prepID)
		if apierr.Is(err, apierr.NotFound) {
			return nil
		}
		return err
	}); err != nil {
		return nil, err
	}
	lease, done, err := s.acquire(ctx, m, c, reference, prepID)
	if err != nil || done {
		return nil, err
	}
	if hooks.AfterAcquire != nil {
		hooks.AfterAcquire()
	}
	values, err := s.dispatch(ctx, m, ring, sink, c, &lease)
	if err != nil {
		return nil, err
	}
	// From here the values may be on the backend: every way out settles or fails the lease.
	if hooks.AfterDispatchCommit != nil {
		if err := hooks.AfterDispatchCommit(); err != nil {
			s.concludeLater(ctx, m, ring, sink, c, lease)
			return nil, err
		}
	}
	if hooks.BeforeDelivery != nil {
		hooks.BeforeDelivery()
	}
	deliverErr := s.deliver(ctx, sink, c, lease, m.Operation, values)
	if hooks.AfterDelivery != nil {
		if err := hooks.AfterDelivery(); err != nil {
			s.concludeLater(ctx, m, ring, sink, c, lease)
			return nil, err
		}
	}
	digest, present, err := s.readback(ctx, m, ring, sink, lease)
	if err != nil || !present || !equal(digest, lease.expected()) {
		m.OnRefuse(failLease(c.Incarnation.OrganizationID, lease.OperationID, failedDetail))
		why := "its readback does not match what was sealed"
		if deliverErr != nil {
			why = "the delivery failed"
		}
		// Final: the lease failed closed, and no retry of this request can deliver it again.
		return nil, apierr.New(apierr.LeaseUnavailable, "runtime input %s was not delivered (%s); it fails closed: bump bindings_wo_version to prepare a new one", prepID, why)
	}
	org := c.Incarnation.OrganizationID
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := dbsqlc.New(tx).PreparationSettle(ctx, dbsqlc.PreparationSettleParams{
			OrganizationID: org, OperationID: lease.OperationID, Epoch: lease.Epoch, ReadbackDigest: digest,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s changed while it was delivered; apply again", prepID)
		}
		return err
	}, nil
}

func equal(a, b []byte) bool { return len(a) > 0 && string(a) == string(b) }

// leaseState is what the phases of one consumption carry from one to the next.
type leaseState struct {
	OperationID    string
	PreparationID  string
	Reference      string
	MaterialSetID  uuid.UUID
	DigestKeyID    string
	MaterialDigest []byte
	// DeliveryDigest is the value-free readback digest the dispatch recorded, nil for a backend
	// that answers the keyed challenge.
	DeliveryDigest []byte
	Epoch          int64
	Delivery       backend.Delivery
}

// expected is the digest the readback must answer: the value-free one when the dispatch recorded
// one, else the keyed digest stored at sealing.
func (l leaseState) expected() []byte {
	if l.DeliveryDigest != nil {
		return l.DeliveryDigest
	}
	return l.MaterialDigest
}

// backendCallRefused maps why a backend cannot take a delivery now, found before anything was
// claimed: its rate limit (a retryable 503 with the backend's Retry-After), a backend that cannot
// be reached, or an installation whose credentials or place are wrong (the operator's to fix).
func backendCallRefused(err error) error {
	if p := backend.Problem(err, "nothing was claimed: apply again"); p != nil {
		return p
	}
	if errors.Is(err, backend.ErrUnreachable) {
		return apierr.New(apierr.BackendUnreachable, "the backend could not be reached; nothing was claimed: apply again")
	}
	return err
}

// acquire is the lease's first phase: in one transaction, check the preparation against the
// consuming worker, bind the reservation to the exact Ready worker, and claim (SPEC 3.5:
// acquisition validates the reference and the live bound reservation before any backend call).
func (s *Service) acquire(ctx context.Context, m *ownership.Mutation, c Consumer, reference, prepID string) (leaseState, bool, error) {
	var l leaseState
	done := false
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		org := c.Incarnation.OrganizationID
		p, err := lock(ctx, tx, org, nil, &prepID)
		if apierr.Is(err, apierr.NotFound) {
			return apierr.New(apierr.ReferenceMismatch, "no runtime input is prepared for reference %s", reference)
		}
		if err != nil {
			return err
		}
		settled, err := takeable(p, c, reference, prepID)
		if err != nil || settled {
			done = settled
			return err
		}
		names := slices.Clone(p.BindingNames)
		slices.Sort(names)
		// Bind the reservation to this exact worker first: acquisition requires it.
		if _, err := s.Reservations.Bind(ctx, tx, p.OriginReservationID, c.Incarnation, nil); err != nil {
			return err
		}
		epoch, err := dbsqlc.New(tx).PreparationAcquire(ctx, dbsqlc.PreparationAcquireParams{
			OrganizationID: org, OperationID: p.OperationID, Epoch: p.Epoch, Reference: reference,
			Space: c.Incarnation.Space, WorkerName: c.Incarnation.Name, ClaimOperationID: &m.Operation,
			WorkerUID: &c.Incarnation.UID, WorkerRevision: &c.Incarnation.Revision, NativeName: &c.ScriptName,
		})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s could not be claimed for this worker (the claim expired or was aborted, or the worker changed)", prepID)
		}
		if err != nil {
			return err
		}
		l = leaseState{OperationID: p.OperationID, PreparationID: p.PreparationID, Reference: p.Reference, MaterialSetID: p.MaterialSetID,
			DigestKeyID: p.DigestKeyID, MaterialDigest: p.MaterialDigest, Epoch: epoch}
		l.Delivery = backend.Delivery{ScriptName: c.ScriptName, WorkerUID: c.Incarnation.UID, PreparationID: p.PreparationID,
			MaterialSetID: p.MaterialSetID, SecretNames: names}
		return nil
	})
	return l, done, err
}

// takeable is what acquire checks of preparation p before it claims it for the worker c
// describes: the refusal (another reference, another target, other binding names, delivered to
// or claimed by another worker, being delivered), or whether it is settled for this worker already.
func takeable(p dbsqlc.PreparationLockRow, c Consumer, reference, prepID string) (settled bool, err error) {
	if p.Reference != reference {
		return false, apierr.New(apierr.ReferenceMismatch, "runtime input %s has another reference", prepID)
	}
	if p.Space != c.Incarnation.Space || p.WorkerName != c.Incarnation.Name {
		return false, apierr.New(apierr.TargetMismatch, "runtime input %s targets worker %s/%s, not %s/%s", prepID, p.Space, p.WorkerName, c.Incarnation.Space, c.Incarnation.Name)
	}
	names := slices.Clone(p.BindingNames)
	slices.Sort(names)
	if !slices.Equal(names, c.Required) {
		return false, apierr.New(apierr.TargetMismatch, "runtime input %s binds %v but the worker requires exactly %v (requiredSensitiveVars)", prepID, names, c.Required)
	}
	mine := p.WorkerUID != nil && *p.WorkerUID == c.Incarnation.UID
	switch {
	case p.Status == dbsqlc.RuntimeInputStatusSettled && mine:
		return true, nil
	case p.Status == dbsqlc.RuntimeInputStatusSettled:
		return false, apierr.New(apierr.LeaseUnavailable, "runtime input %s was delivered to another worker (uid %s); a replaced worker needs a new runtime input: replace it too, or bump bindings_wo_version", prepID, p.WorkerUID)
	case p.Status == dbsqlc.RuntimeInputStatusPrepared, p.Status == dbsqlc.RuntimeInputStatusClaimed && mine:
		return false, nil
	case p.Status == dbsqlc.RuntimeInputStatusDispatched:
		return false, apierr.New(apierr.IntentInProgress, "runtime input %s is being delivered; retry", prepID)
	default:
		return false, apierr.New(apierr.LeaseUnavailable, "runtime input %s is %s; prepare a new one (bump bindings_wo_version)", prepID, p.Status)
	}
}

// Admissible refuses, in tx, a worker put whose runtime input the worker c describes could not
// take, with the refusal Consume would give before it claims anything, so that a put refused for
// its runtime input is refused before it changes or deploys anything (a bad input changes
// nothing). It claims nothing; Consume checks again when it claims.
func (s *Service) Admissible(ctx context.Context, tx pgx.Tx, c Consumer, reference string) error {
	prepID, ok := parseReference(reference)
	if !ok {
		return apierr.New(apierr.ReferenceMismatch, "runtimeInputReference %q is not a well-formed reference", reference)
	}
	// Read as it stands, not swept: a row whose time ran out reads as it was, and Consume, which
	// sweeps it in a transaction of its own (so that the expiry stands), refuses it.
	p, err := dbsqlc.New(tx).PreparationLock(ctx, dbsqlc.PreparationLockParams{OrganizationID: c.Incarnation.OrganizationID, PreparationID: &prepID})
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.ReferenceMismatch, "no runtime input is prepared for reference %s", reference)
	}
	if err != nil {
		return fmt.Errorf("runtime input: lock: %w", err)
	}
	_, err = takeable(p, c, reference, prepID)
	return err
}

// dispatch is the second phase: open the sealed material, then clear it in the compare-and-swap
// that authorizes delivery, in one transaction. Of several Hosts racing to dispatch one claim,
// the CAS lets exactly one deliver. Material that cannot be opened fails closed, once.
//
// A pool (backend.PoolSink with a key) gets the values sealed to its public key instead, and the
// same CAS keeps that blob (SPEC 6.2): it is what the delivery carries, in place of the values.
func (s *Service) dispatch(ctx context.Context, m *ownership.Mutation, ring *sealing.Ring, sink backend.SecretSink, c Consumer, l *leaseState) (delivery, error) {
	// The pack decides which readback settles its deliveries: a value-free one has its expected
	// digest recorded by the CAS that authorizes the delivery (SPEC 3.5).
	var deliveryDigest []byte
	if vf, ok := sink.(backend.ValueFreeSink); ok {
		deliveryDigest = vf.ExpectedDigest(l.Delivery)
	}
	org := c.Incarnation.OrganizationID
	pool, _ := sink.(backend.PoolSink)
	var out delivery
	var unreadable error
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		out = delivery{}
		q := dbsqlc.New(tx)
		row, err := q.PreparationSealed(ctx, dbsqlc.PreparationSealedParams{OrganizationID: org, OperationID: l.OperationID})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s is no longer claimed (the claim expired or was aborted); apply again", l.PreparationID)
		}
		if err != nil {
			return fmt.Errorf("runtime input: read sealed material: %w", err)
		}
		sealed := sealing.Sealed{Nonce: row.SealingNonce, Ciphertext: row.Ciphertext}
		if row.SealingKeyID != nil {
			sealed.KeyID = *row.SealingKeyID
		}
		plain, err := ring.Open(ctx, tx, sealed, aad(org, l.PreparationID, l.Reference))
		if err == nil {
			out.values, err = decodeMaterial(plain)
		}
		if err != nil {
			unreadable = err
			return errUnreadable
		}
		if pool != nil {
			blob, ok, err := pool.PoolSeal(l.Delivery, plain)
			if err != nil {
				return fmt.Errorf("runtime input: seal to the pool: %w", err)
			}
			if ok {
				out = delivery{blob: blob}
			}
		}
		epoch, err := q.PreparationDispatch(ctx, dbsqlc.PreparationDispatchParams{OrganizationID: org, OperationID: l.OperationID, Epoch: l.Epoch,
			DeliveryDigest: deliveryDigest, PoolBlob: out.blob})
		if errors.Is(err, pgx.ErrNoRows) {
			return apierr.New(apierr.LeaseUnavailable, "runtime input %s: the worker, its reservation or its placement changed after the claim (or the claim expired); apply again", l.PreparationID)
		}
		l.Epoch, l.DeliveryDigest = epoch, deliveryDigest
		return err
	})
	if errors.Is(err, errUnreadable) {
		m.OnRefuse(failLease(org, l.OperationID, "sealed material unreadable: "+unreadableReason(unreadable)))
		return delivery{}, apierr.New(apierr.SealedMaterial, "runtime input %s cannot be opened (%s); it fails closed: bump bindings_wo_version to prepare a new one", l.PreparationID, unreadableReason(unreadable))
	}
	return out, err
}

// delivery is what one dispatch gives the backend: the values, or a pool's blob of them.
type delivery struct {
	values map[string]vocab.Secret
	blob   []byte
}

func unreadableReason(err error) string {
	if errors.Is(err, sealing.ErrUnknownKey) {
		return "sealed under a retired key"
	}
	return "corrupt or moved"
}

var errUnreadable = errors.New("sealed material unreadable")

func decodeMaterial(plain []byte) (map[string]vocab.Secret, error) {
	var m map[string]string
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, err
	}
	out := make(map[string]vocab.Secret, len(m))
	for k, v := range m {
		out[k] = vocab.NewSecret(v)
	}
	return out, nil
}

// deliver is the one backend call that carries values. The delivery is named by the sealed
// material's id, and the call is idempotent by an effect id derived from the claim.
func (s *Service) deliver(ctx context.Context, sink backend.SecretSink, c Consumer, l leaseState, claim uuid.UUID, give delivery) error {
	ctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	defer cancel()
	d := l.Delivery
	d.EffectID = uuid.NewSHA1(uuid.NameSpaceURL, []byte("takoform:delivery:"+claim.String()+":"+l.PreparationID))
	if give.blob != nil {
		return sink.(backend.PoolSink).DeliverSealed(ctx, d, give.blob)
	}
	return sink.DeliverSecrets(ctx, d, give.values)
}

// readback derives the preparation's challenge and asks the backend for its digest of what it
// holds: the challenge in one short transaction, the backend call outside any.
func (s *Service) readback(ctx context.Context, tx txRunner, ring *sealing.Ring, sink backend.SecretSink, l leaseState) ([]byte, bool, error) {
	var challenge []byte
	if err := tx.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		challenge, err = ring.Challenge(ctx, tx, l.DigestKeyID, l.PreparationID, l.MaterialSetID)
		return err
	}); err != nil {
		return nil, false, err
	}
	// The values may already be there: a blip in reaching the backend must not fail for good a
	// lease that one more answer would settle, so an unanswered readback is asked again, bounded.
	var (
		digest  []byte
		present bool
		err     error
	)
	for attempt := range readbackAttempts {
		if attempt > 0 {
			select {
			case <-ctx.Done():
				return nil, false, err
			case <-time.After(time.Duration(attempt) * 500 * time.Millisecond):
			}
		}
		cctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
		digest, present, err = sink.ReadbackSecrets(cctx, l.Delivery, challenge)
		cancel()
		if err == nil {
			return digest, present, nil
		}
	}
	return nil, false, err
}

// readbackAttempts bounds how often an unanswered readback is asked again.
const readbackAttempts = 4

// txRunner runs a transaction: an ownership.Mutation or Recovery.
type txRunner interface {
	Tx(ctx context.Context, fn func(pgx.Tx) error) error
}

// concludeLater settles or fails a dispatched lease that a consumption stops on, by readback, in
// the refusal's transaction; it never delivers again.
func (s *Service) concludeLater(ctx context.Context, m *ownership.Mutation, ring *sealing.Ring, sink backend.SecretSink, c Consumer, l leaseState) {
	digest, present, err := s.readback(context.WithoutCancel(ctx), m, ring, sink, l)
	org := c.Incarnation.OrganizationID
	if err == nil && present && equal(digest, l.expected()) {
		m.OnRefuse(func(ctx context.Context, tx pgx.Tx) error {
			_, err := dbsqlc.New(tx).PreparationSettle(ctx, dbsqlc.PreparationSettleParams{OrganizationID: org, OperationID: l.OperationID, Epoch: l.Epoch, ReadbackDigest: digest})
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			return err
		})
		return
	}
	m.OnRefuse(failLease(org, l.OperationID, failedDetail))
}

func failLease(org, operationID, detail string) func(context.Context, pgx.Tx) error {
	return func(ctx context.Context, tx pgx.Tx) error {
		_, err := dbsqlc.New(tx).PreparationFail(ctx, dbsqlc.PreparationFailParams{OrganizationID: org, OperationID: operationID, Failure: &detail})
		return err
	}
}

// Recovered is what lease recovery found for one dispatched lease, for the recovery's last
// transaction to record.
type Recovered struct {
	org, operationID string
	epoch            int64
	digest           []byte
	settled          bool
}

// ObserveLeases reads back, for an interrupted operation, every lease it dispatched and never
// settled (SPEC 3.5: recovery may settle an acknowledgement loss by readback; it can never
// redispatch, return values, or depend on a reservation or endpoint that may since have been
// deleted). The backend calls run outside any transaction; Record writes what they found.
func (s *Service) ObserveLeases(ctx context.Context, r txRunner, installations map[string]catalog.Installation, op uuid.UUID) ([]Recovered, error) {
	var rows []dbsqlc.PreparationsDispatchedByOperationRow
	if err := r.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		rows, err = dbsqlc.New(tx).PreparationsDispatchedByOperation(ctx, &op)
		return err
	}); err != nil {
		return nil, fmt.Errorf("runtime input: recover: %w", err)
	}
	var out []Recovered
	for _, row := range rows {
		rec := Recovered{org: row.OrganizationID, operationID: row.OperationID, epoch: row.Epoch}
		inst, ok := installations[deref(row.Installation)]
		if ok && row.NativeName != nil && s.Ring != nil {
			if sink, err := s.Backends.SecretSink(inst); err == nil {
				l := leaseState{OperationID: row.OperationID, PreparationID: row.PreparationID, MaterialSetID: row.MaterialSetID, DigestKeyID: row.DigestKeyID,
					MaterialDigest: row.MaterialDigest, DeliveryDigest: row.DeliveryDigest}
				l.Delivery = backend.Delivery{ScriptName: *row.NativeName, PreparationID: row.PreparationID, MaterialSetID: row.MaterialSetID, SecretNames: row.BindingNames}
				if row.WorkerUID != nil {
					l.Delivery.WorkerUID = *row.WorkerUID
				}
				digest, present, err := s.readback(ctx, r, s.Ring, sink, l)
				if err != nil {
					return nil, fmt.Errorf("runtime input: read back %s: %w", row.PreparationID, err)
				}
				rec.settled, rec.digest = present && equal(digest, l.expected()), digest
			}
		}
		out = append(out, rec)
	}
	return out, nil
}

// RecordLeases writes, in the recovery's last transaction, what ObserveLeases found: a lease
// whose readback matches settles; any other fails, saying to prepare a new one.
func RecordLeases(ctx context.Context, tx pgx.Tx, found []Recovered) error {
	q := dbsqlc.New(tx)
	for _, r := range found {
		if r.settled {
			if _, err := q.PreparationSettle(ctx, dbsqlc.PreparationSettleParams{OrganizationID: r.org, OperationID: r.operationID, Epoch: r.epoch, ReadbackDigest: r.digest}); err == nil {
				continue
			} else if !errors.Is(err, pgx.ErrNoRows) {
				return err
			}
		}
		if err := failLease(r.org, r.operationID, failedDetail)(ctx, tx); err != nil {
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

// BackendCallTimeout bounds one backend call of the lease, well inside an ownership lease.
const BackendCallTimeout = 20 * time.Second
