package sealing

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Rewrap wraps every data key, runtime-input commitment secret and Host secret under next instead of current,
// in one transaction, so that a leaked key-encryption key can be retired (takoserver keys
// rewrap). What is already under next is left as it is, so a second run changes nothing; one
// under a third key-encryption key refuses the whole re-wrap. The data keys themselves do not
// change: nothing sealed is touched, and replicas running with current keep serving from the keys
// they unwrapped at start until they restart with next. It returns how many it re-wrapped.
func Rewrap(ctx context.Context, db store.Beginner, current, next KEK) (int, error) {
	if current.ID == next.ID {
		return 0, fmt.Errorf("sealing: the new key-encryption key is the current one (id %s)", current.ID)
	}
	from, to := &Ring{kek: current}, &Ring{kek: next}
	n := 0
	err := store.WithTx(ctx, db, func(tx pgx.Tx) error {
		n = 0
		q := dbsqlc.New(tx)
		keys, err := q.SealingKeysForRewrap(ctx)
		if err != nil {
			return fmt.Errorf("sealing: read the data keys: %w", err)
		}
		for _, k := range keys {
			switch k.KEKID {
			case next.ID:
				continue
			case current.ID:
			default:
				return fmt.Errorf("sealing: data key %s is wrapped by key-encryption key %s, neither the current (%s) nor the new one (%s): nothing was re-wrapped", k.ID, k.KEKID, current.ID, next.ID)
			}
			plain, err := from.unwrap(k.ID, k.WrappedKey)
			if err != nil {
				return fmt.Errorf("sealing: data key %s does not unwrap under the current key-encryption key: nothing was re-wrapped", k.ID)
			}
			wrapped, err := to.wrap(k.ID, plain)
			if err != nil {
				return err
			}
			if err := q.SealingKeyRewrap(ctx, dbsqlc.SealingKeyRewrapParams{ID: k.ID, KEKID: next.ID, WrappedKey: wrapped}); err != nil {
				return fmt.Errorf("sealing: re-wrap data key %s: %w", k.ID, err)
			}
			n++
		}
		secrets, err := q.CommitmentSecretsForRewrap(ctx)
		if err != nil {
			return fmt.Errorf("sealing: read the commitment secrets: %w", err)
		}
		for _, c := range secrets {
			switch c.KEKID {
			case next.ID:
				continue
			case current.ID:
			default:
				return fmt.Errorf("sealing: commitment secret %s is wrapped by key-encryption key %s, neither the current (%s) nor the new one (%s): nothing was re-wrapped", c.ID, c.KEKID, current.ID, next.ID)
			}
			plain, err := from.unwrapAs(commitmentAAD(c.ID), c.WrappedSecret)
			if err != nil {
				return fmt.Errorf("sealing: commitment secret %s does not unwrap under the current key-encryption key: nothing was re-wrapped", c.ID)
			}
			wrapped, err := to.wrapAs(commitmentAAD(c.ID), plain)
			if err != nil {
				return err
			}
			if err := q.CommitmentSecretRewrap(ctx, dbsqlc.CommitmentSecretRewrapParams{ID: c.ID, KEKID: next.ID, WrappedSecret: wrapped}); err != nil {
				return fmt.Errorf("sealing: re-wrap commitment secret %s: %w", c.ID, err)
			}
			n++
		}
		hostSecrets, err := q.HostSecretsForRewrap(ctx)
		if err != nil {
			return fmt.Errorf("sealing: read the Host secrets: %w", err)
		}
		for _, h := range hostSecrets {
			switch h.KEKID {
			case next.ID:
				continue
			case current.ID:
			default:
				return fmt.Errorf("sealing: Host secret %s is wrapped by key-encryption key %s, neither the current (%s) nor the new one (%s): nothing was re-wrapped", h.Name, h.KEKID, current.ID, next.ID)
			}
			plain, err := from.unwrapAs(hostSecretAAD(h.Name), h.WrappedSecret)
			if err != nil {
				return fmt.Errorf("sealing: Host secret %s does not unwrap under the current key-encryption key: nothing was re-wrapped", h.Name)
			}
			wrapped, err := to.wrapAs(hostSecretAAD(h.Name), plain)
			if err != nil {
				return err
			}
			if err := q.HostSecretRewrap(ctx, dbsqlc.HostSecretRewrapParams{Name: h.Name, KEKID: next.ID, WrappedSecret: wrapped}); err != nil {
				return fmt.Errorf("sealing: re-wrap Host secret %s: %w", h.Name, err)
			}
			n++
		}
		return nil
	})
	return n, err
}
