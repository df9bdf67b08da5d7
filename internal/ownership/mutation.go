package ownership

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Mutation is one owned request in progress. Its effect runs as transactions (Tx for the phases
// before and between backend calls, Commit for the last), never holding one open across a backend
// call. The first of them takes the key: under the key's transaction lock it decides afresh
// whether the request is a replay, a conflict or new work, and, when the effect will need more
// than one transaction, takes the key's lease in the same transaction as the effect's first phase.
type Mutation struct {
	// Operation is the request's ledger id.
	Operation uuid.UUID
	// Current is the binding before this request (nil when none). Valid once the first
	// transaction has run.
	Current *Binding
	Intent  Intent

	mgr      *Manager
	hash     []byte
	deleting bool
	started  bool // the lease is held and the operation is running
	finished bool
	stop     func()
	refusers []func(context.Context, pgx.Tx) error
	opened   *openedTx // the first read's transaction, holding the key's lock, for the first phase
}

// openedTx is the request's first transaction, begun by its first read under the key's lock, and
// what that read saw.
type openedTx struct {
	tx   pgx.Tx
	rows []entry
}

// dropOpened ends the first read's transaction when no phase took it.
func (m *Mutation) dropOpened(ctx context.Context) {
	if m.opened != nil {
		_ = m.opened.tx.Rollback(context.WithoutCancel(ctx))
		m.opened = nil
	}
}

// Tx runs one phase of the effect in a transaction. The first phase takes the key's lease.
func (m *Mutation) Tx(ctx context.Context, fn func(tx pgx.Tx) error) error {
	if m.finished {
		return errors.New("ownership: mutation already finished")
	}
	if !m.started {
		return m.begin(ctx, false, func(tx pgx.Tx) error { return fn(tx) })
	}
	return store.WithTx(ctx, m.mgr.DB, func(tx pgx.Tx) error {
		if err := m.held(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// Commit runs the effect's last phase: fn's response is bound to the token (or, for a delete,
// kept in a tombstone) and the operation is committed in the same transaction as fn's writes. An
// effect with no backend call is this one transaction from start to end.
func (m *Mutation) Commit(ctx context.Context, fn func(tx pgx.Tx) (Response, error)) (Response, error) {
	if m.finished {
		return Response{}, errors.New("ownership: mutation already finished")
	}
	var resp Response
	body := func(tx pgx.Tx) error {
		var err error
		if resp, err = fn(tx); err != nil {
			return err
		}
		if resp.Status < 200 || resp.Status > 299 {
			return fmt.Errorf("ownership: effect returned status %d without an error", resp.Status)
		}
		// The outcome's writes are the transaction's last: they travel with its COMMIT.
		return m.record(ctx, dbsqlc.New(store.Deferred(tx)), &resp)
	}
	var err error
	if !m.started {
		err = m.begin(ctx, true, body)
	} else {
		err = store.WithTx(ctx, m.mgr.DB, func(tx pgx.Tx) error {
			if err := m.held(ctx, tx); err != nil {
				return err
			}
			return body(tx)
		})
	}
	if err != nil {
		return Response{}, err
	}
	m.finished = true
	m.stopHeartbeat()
	return resp, nil
}

// OnRefuse registers cleanup that runs in the transaction that records the request's refusal,
// once the lease is held: a create that never committed leaves nothing standing.
func (m *Mutation) OnRefuse(fn func(ctx context.Context, tx pgx.Tx) error) {
	m.refusers = append(m.refusers, fn)
}

// CheckRevision refuses an update whose If-Match names another revision than the object's
// current one (SPEC 3.2), so a late copy of an older update never reverts a newer one.
func (m *Mutation) CheckRevision(current int64) error {
	if m.Intent.IfMatch != nil && *m.Intent.IfMatch != current {
		return apierr.New(apierr.RevisionConflict, "the request names revision %d but the %s is at revision %d; read it again", *m.Intent.IfMatch, m.Intent.Kind, current).
			With("currentRevision", current)
	}
	return nil
}

// CheckRevisionAfter is CheckRevision for an object that multi-transaction requests change, whose
// current revision madeBy (an operation) wrote. When madeBy is an abandoned attempt of this very
// request (same owner token, same request: its Host stopped mid-way and recovery settled it), the
// request's If-Match names the revision that attempt began from, and the retry goes on from the
// revision the attempt made instead of meeting revision_conflict.
func (m *Mutation) CheckRevisionAfter(ctx context.Context, db dbsqlc.DBTX, current int64, madeBy uuid.UUID) error {
	err := m.CheckRevision(current)
	if err == nil {
		return nil
	}
	retry, qerr := dbsqlc.New(db).OperationAbandonedAttempt(ctx, dbsqlc.OperationAbandonedAttemptParams{
		ID: madeBy, OrganizationID: m.Intent.OrganizationID, RequestDigest: m.requestDigest(),
	})
	if qerr != nil {
		return fmt.Errorf("ownership: the operation that made the revision: %w", qerr)
	}
	if retry {
		return nil
	}
	return err
}

// requestDigest identifies this request of this owner (SHA-256 over the token and the request
// hash), for the operation's row: never the token itself.
func (m *Mutation) requestDigest() []byte {
	d := sha256.New()
	d.Write([]byte(m.Intent.Token))
	d.Write([]byte{0})
	d.Write(m.hash)
	return d.Sum(nil)
}

// begin is the first transaction: the key lock, the decision under it, the operation and, unless
// this is also the last transaction, the lease; then the effect's first phase.
func (m *Mutation) begin(ctx context.Context, last bool, fn func(tx pgx.Tx) error) error {
	in := m.Intent
	var abandoned *uuid.UUID
	phase := func(tx pgx.Tx, rows []entry) error {
		q := dbsqlc.New(tx)
		rec := readRecord(rows)
		if rec.intent != nil {
			if !rec.intentExpired {
				return errBusy
			}
			abandoned = rec.intent
			return nil
		}
		if resp, err := decide(in, m.hash, m.deleting, rec); resp != nil || err != nil {
			a := &answeredError{err: err}
			if resp != nil {
				a.resp = *resp
			}
			return a
		}
		m.Current = rec.binding
		if rec.braked {
			return errBraked()
		}
		if m.Intent.IfMatch != nil && m.Current == nil {
			return apierr.New(apierr.RevisionConflict, "If-Match names revision %d but there is no %s to match", *m.Intent.IfMatch, in.Kind)
		}
		if last {
			// The whole effect is this transaction: the operation is recorded with its outcome.
			return fn(tx)
		}
		if err := q.OperationBegin(ctx, dbsqlc.OperationBeginParams{
			ID: m.Operation, OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Method: in.Method,
			RequestDigest: m.requestDigest(),
		}); err != nil {
			return fmt.Errorf("ownership: begin operation: %w", err)
		}
		if err := q.OwnershipIntentAcquire(ctx, dbsqlc.OwnershipIntentAcquireParams{
			OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, OperationID: m.Operation,
			Holder: m.mgr.Holder, LeaseSeconds: m.mgr.leaseTTL().Seconds(),
		}); err != nil {
			return fmt.Errorf("ownership: take lease: %w", err)
		}
		return fn(tx)
	}
	var err error
	if o := m.opened; o != nil {
		// The first read took the key's lock: the decision under it and this phase run in its
		// transaction.
		m.opened = nil
		err = store.RunTx(ctx, o.tx, func(tx pgx.Tx) error { return phase(tx, o.rows) })
	} else {
		err = store.WithTx(ctx, m.mgr.DB, func(tx pgx.Tx) error {
			rows, err := dbsqlc.New(tx).OwnershipLock(ctx, lockParams(in, false))
			if err != nil {
				return fmt.Errorf("ownership: lock: %w", err)
			}
			return phase(tx, rows)
		})
	}
	if err != nil {
		if errors.Is(err, store.ErrContention) {
			return errBusy
		}
		return err
	}
	if abandoned != nil {
		// A Host stopped mid-request on this key: settle that first, then start over.
		if err := m.mgr.recoverAbandoned(ctx, in.OrganizationID, in.Kind, in.Key, *abandoned); err != nil {
			return err
		}
		return errRecovered
	}
	if !last {
		m.started = true
		m.startHeartbeat()
	}
	return nil
}

// held proves, inside a later phase's transaction, that the lease is still this request's, and
// locks it for the phase.
func (m *Mutation) held(ctx context.Context, tx pgx.Tx) error {
	_, err := dbsqlc.New(tx).OwnershipIntentHeld(ctx, dbsqlc.OwnershipIntentHeldParams{
		OrganizationID: m.Intent.OrganizationID, Kind: m.Intent.Kind, ExternalKey: m.Intent.Key, OperationID: m.Operation,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return errLeaseLost
	}
	if err != nil {
		return fmt.Errorf("ownership: lease: %w", err)
	}
	return nil
}

// record writes the committed outcome: the operation, the binding with its stored response (or
// the tombstone and the binding's removal), and the lease's release.
func (m *Mutation) record(ctx context.Context, q *dbsqlc.Queries, resp *Response) error {
	in := m.Intent
	if !m.deleting {
		if err := q.OwnershipCommitBinding(ctx, dbsqlc.OwnershipCommitBindingParams{
			OperationID: m.Operation, OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Method: in.Method,
			Leased: m.started, Token: in.Token, RequestHash: m.hash, ObjectUID: resp.UID,
			ResponseStatus: int32(resp.Status), ResponseBody: resp.Body,
		}); err != nil {
			return fmt.Errorf("ownership: commit: %w", err)
		}
		return nil
	}
	if m.started {
		if _, err := q.OperationFinish(ctx, dbsqlc.OperationFinishParams{ID: m.Operation, Status: dbsqlc.OperationStatusCommitted}); err != nil {
			return fmt.Errorf("ownership: finish operation: %w", err)
		}
		if err := q.OwnershipIntentRelease(ctx, dbsqlc.OwnershipIntentReleaseParams{
			OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, OperationID: m.Operation,
		}); err != nil {
			return fmt.Errorf("ownership: release lease: %w", err)
		}
	} else if err := q.OperationRecord(ctx, dbsqlc.OperationRecordParams{
		ID: m.Operation, OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Method: in.Method, Status: dbsqlc.OperationStatusCommitted,
	}); err != nil {
		return fmt.Errorf("ownership: record operation: %w", err)
	}
	resp.UID = m.Current.UID
	if err := q.OwnershipTombstoneCreate(ctx, dbsqlc.OwnershipTombstoneCreateParams{
		OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Token: in.Token, ObjectUID: resp.UID,
		RequestHash: m.hash, ResponseStatus: int32(resp.Status), ResponseBody: resp.Body, RetentionSeconds: m.mgr.retention().Seconds(),
	}); err != nil {
		return fmt.Errorf("ownership: tombstone: %w", err)
	}
	if err := q.OwnershipUnbind(ctx, dbsqlc.OwnershipUnbindParams{OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key}); err != nil {
		return fmt.Errorf("ownership: unbind: %w", err)
	}
	return nil
}

func (mgr *Manager) retention() time.Duration {
	if mgr.TombstoneRetention > 0 {
		return mgr.TombstoneRetention
	}
	return 30 * 24 * time.Hour
}

// refuse records the request's refusal: with the lease held, the registered cleanups run, the
// operation is refused and the lease released in one transaction; without it, the refused
// operation is recorded on its own. It returns cause, the refusal the caller gets.
func (m *Mutation) refuse(ctx context.Context, cause error) error {
	m.stopHeartbeat()
	if m.finished {
		return cause
	}
	m.finished = true
	code := string(apierr.Internal)
	if ae, ok := apierr.As(cause); ok {
		code = string(ae.Code)
	} else if errors.Is(cause, store.ErrContention) {
		code = string(apierr.IntentInProgress)
	} else if errors.Is(cause, store.ErrUnavailable) {
		code = string(apierr.Unavailable)
	}
	in := m.Intent
	ctx = context.WithoutCancel(ctx)
	err := store.WithTx(ctx, m.mgr.DB, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		if !m.started {
			return q.OperationRecord(ctx, dbsqlc.OperationRecordParams{
				ID: m.Operation, OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, Method: in.Method,
				Status: dbsqlc.OperationStatusRefused, Code: &code,
			})
		}
		if err := m.held(ctx, tx); err != nil {
			return err
		}
		for _, fn := range m.refusers {
			if err := fn(ctx, tx); err != nil {
				return err
			}
		}
		if _, err := q.OperationFinish(ctx, dbsqlc.OperationFinishParams{ID: m.Operation, Status: dbsqlc.OperationStatusRefused, Code: &code}); err != nil {
			return err
		}
		return q.OwnershipIntentRelease(ctx, dbsqlc.OwnershipIntentReleaseParams{
			OrganizationID: in.OrganizationID, Kind: in.Kind, ExternalKey: in.Key, OperationID: m.Operation,
		})
	})
	// When this write fails with the lease held, the lease stays and expires: recovery then settles
	// the operation from what the backend holds. Nothing is lost; the caller still gets the refusal.
	_ = err
	return cause
}

func (m *Mutation) startHeartbeat() {
	m.stop = m.mgr.renew(m.Intent.OrganizationID, m.Intent.Kind, m.Intent.Key, m.Operation)
}

func (m *Mutation) stopHeartbeat() {
	if m.stop != nil {
		m.stop()
	}
}
