package ownership

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Recovery is what Manager.Recover works with: the abandoned operation, and transactions that
// hold its key's lease in that operation's name.
type Recovery struct {
	Operation      uuid.UUID
	OrganizationID string
	Kind           string
	Key            string
	mgr            *Manager
	finished       bool
}

// Tx runs fn in a transaction that holds the lease.
func (r *Recovery) Tx(ctx context.Context, fn func(pgx.Tx) error) error {
	return store.WithTx(ctx, r.mgr.DB, func(tx pgx.Tx) error {
		if err := r.held(ctx, tx); err != nil {
			return err
		}
		return fn(tx)
	})
}

// Finish runs fn and, in the same transaction, records the operation refused as abandoned and
// releases the lease: no fence ever sees the operation settled before its effects are.
func (r *Recovery) Finish(ctx context.Context, fn func(pgx.Tx) error) error {
	err := r.Tx(ctx, func(tx pgx.Tx) error {
		if fn != nil {
			if err := fn(tx); err != nil {
				return err
			}
		}
		q := dbsqlc.New(tx)
		code := "abandoned"
		if _, err := q.OperationFinish(ctx, dbsqlc.OperationFinishParams{ID: r.Operation, Status: dbsqlc.OperationStatusRefused, Code: &code}); err != nil {
			return err
		}
		return q.OwnershipIntentRelease(ctx, dbsqlc.OwnershipIntentReleaseParams{
			OrganizationID: r.OrganizationID, Kind: r.Kind, ExternalKey: r.Key, OperationID: r.Operation,
		})
	})
	if err == nil {
		r.finished = true
	}
	return err
}

func (r *Recovery) held(ctx context.Context, tx pgx.Tx) error {
	_, err := dbsqlc.New(tx).OwnershipIntentHeld(ctx, dbsqlc.OwnershipIntentHeldParams{
		OrganizationID: r.OrganizationID, Kind: r.Kind, ExternalKey: r.Key, OperationID: r.Operation,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return errLeaseLost
	}
	return err
}

// recoverAbandoned settles an operation whose lease expired: it takes the lease over in that
// operation's name, lets Recover read the backend back and record what is there, and releases
// it. A recovery that fails gives the lease back expired, for the next try.
func (mgr *Manager) recoverAbandoned(ctx context.Context, org, kind, key string, op uuid.UUID) error {
	took := false
	err := store.WithTx(ctx, mgr.DB, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		rows, err := q.OwnershipLock(ctx, dbsqlc.OwnershipLockParams{OrganizationID: org, Kind: kind, ExternalKey: key, LockWait: lockWait})
		if err != nil {
			return err
		}
		rec := readRecord(rows)
		if rec.intent == nil || *rec.intent != op || !rec.intentExpired {
			return nil // someone else is on it, or it is done
		}
		took = true
		return q.OwnershipIntentAcquire(ctx, dbsqlc.OwnershipIntentAcquireParams{
			OrganizationID: org, Kind: kind, ExternalKey: key, OperationID: op, Holder: mgr.Holder, LeaseSeconds: mgr.leaseTTL().Seconds(),
		})
	})
	if err != nil || !took {
		if errors.Is(err, store.ErrContention) {
			return errBusy
		}
		return err
	}
	r := &Recovery{Operation: op, OrganizationID: org, Kind: kind, Key: key, mgr: mgr}
	stop := mgr.renew(org, kind, key, op)
	defer stop()
	if mgr.Recover != nil {
		err = mgr.Recover(ctx, r)
	}
	if err == nil && !r.finished {
		err = r.Finish(ctx, nil)
	}
	if err != nil {
		_ = dbsqlc.New(mgr.DB).OwnershipIntentExpire(context.WithoutCancel(ctx), dbsqlc.OwnershipIntentExpireParams{
			OrganizationID: org, Kind: kind, ExternalKey: key, OperationID: op,
		})
		return fmt.Errorf("ownership: recover operation %s: %w", op, err)
	}
	return nil
}

// renew keeps a lease alive until the returned stop is called.
func (mgr *Manager) renew(org, kind, key string, op uuid.UUID) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(mgr.leaseTTL() / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				_, _ = dbsqlc.New(mgr.DB).OwnershipIntentRenew(ctx, dbsqlc.OwnershipIntentRenewParams{
					OrganizationID: org, Kind: kind, ExternalKey: key, OperationID: op, LeaseSeconds: mgr.leaseTTL().Seconds(),
				})
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// RecoverExpired settles the operations of every expired lease (their Hosts stopped) and reports
// how many it settled. The janitor calls it; so does any request that meets such a lease.
func (mgr *Manager) RecoverExpired(ctx context.Context) (int, error) {
	rows, err := dbsqlc.New(mgr.DB).OwnershipIntentsExpired(ctx)
	if err != nil {
		return 0, fmt.Errorf("ownership: expired leases: %w", store.Classify(err))
	}
	settled := 0
	var firstErr error
	for _, r := range rows {
		if err := mgr.recoverAbandoned(ctx, r.OrganizationID, r.Kind, r.ExternalKey, r.OperationID); err != nil {
			if firstErr == nil && !errors.Is(err, errBusy) {
				firstErr = err
			}
			continue
		}
		settled++
	}
	return settled, firstErr
}
