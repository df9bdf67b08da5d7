package sealing

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// ErrUnknownCommitmentSecret: no commitment secret of this database has that id (or this
// replica's key-encryption key cannot unwrap it).
var ErrUnknownCommitmentSecret = errors.New("sealing: unknown runtime-input commitment secret")

// Commitment secrets (SPEC 3.5, rip2) are 32 random bytes in PostgreSQL, wrapped by the
// key-encryption key under an AAD of their own (never interchangeable with a data key), and never
// rotated with the data keys: a rip2 reference names the secret it was made under.
func commitmentAAD(id string) []byte {
	return []byte("takoform runtime-input commitment secret v1\x00" + id)
}

// initCommitmentSecret creates the database's first commitment secret when it has none, and
// refuses a key-encryption key that cannot unwrap the current one.
func (r *Ring) initCommitmentSecret(ctx context.Context, q *dbsqlc.Queries) error {
	id := "c" + newKeyID()[1:]
	wrapped, err := r.wrapAs(commitmentAAD(id), randomKey())
	if err != nil {
		return err
	}
	if _, err := q.CommitmentSecretInit(ctx, dbsqlc.CommitmentSecretInitParams{ID: id, KEKID: r.kek.ID, WrappedSecret: wrapped}); err != nil {
		return fmt.Errorf("sealing: create the runtime-input commitment secret: %w", store.Classify(err))
	}
	cur, err := q.CommitmentSecretCurrent(ctx)
	if err != nil {
		return fmt.Errorf("sealing: read the runtime-input commitment secret: %w", store.Classify(err))
	}
	if _, err := r.commitmentSecret(cur.ID, cur.WrappedSecret); err != nil {
		// Unwrapped once here and kept: a replica keeps answering through a re-wrap under
		// another key-encryption key (keys rewrap) until it restarts with that key.
		return fmt.Errorf("sealing: this Host's key-encryption key (id %s) cannot unwrap the runtime-input commitment secret %s, which was wrapped by key-encryption key %s; give every Host replica the same --sealing-key-file",
			r.kek.ID, cur.ID, cur.KEKID)
	}
	return nil
}

// CommitmentKey is the rip2 commitment key of one organization and material-set nonce under the
// current commitment secret, and that secret's id. It is handed only to a caller with a write
// key, and computed again (never stored) whenever a reference is checked.
func (r *Ring) CommitmentKey(ctx context.Context, q dbsqlc.DBTX, org, nonce string) (secretID string, key []byte, err error) {
	cur, err := dbsqlc.New(q).CommitmentSecretCurrent(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil, errors.New("sealing: no runtime-input commitment secret (the Host creates it at start)")
	}
	if err != nil {
		return "", nil, fmt.Errorf("sealing: read the runtime-input commitment secret: %w", store.Classify(err))
	}
	secret, err := r.commitmentSecret(cur.ID, cur.WrappedSecret)
	if err != nil {
		return "", nil, err
	}
	return cur.ID, runtimeref.CommitmentKey(secret, org, nonce), nil
}

// CommitmentKeyUnder is the commitment key under the secret a rip2 reference names.
func (r *Ring) CommitmentKeyUnder(ctx context.Context, q dbsqlc.DBTX, secretID, org, nonce string) ([]byte, error) {
	row, err := dbsqlc.New(q).CommitmentSecretGet(ctx, secretID)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, ErrUnknownCommitmentSecret
	}
	if err != nil {
		return nil, fmt.Errorf("sealing: read a runtime-input commitment secret: %w", store.Classify(err))
	}
	secret, err := r.commitmentSecret(row.ID, row.WrappedSecret)
	if err != nil {
		return nil, err
	}
	return runtimeref.CommitmentKey(secret, org, nonce), nil
}

// commitmentSecret unwraps a commitment secret, once per replica.
func (r *Ring) commitmentSecret(id string, wrapped []byte) ([]byte, error) {
	r.mu.RLock()
	s, ok := r.commitments[id]
	r.mu.RUnlock()
	if ok {
		return s, nil
	}
	s, err := r.unwrapAs(commitmentAAD(id), wrapped)
	if err != nil {
		return nil, ErrUnknownCommitmentSecret
	}
	r.mu.Lock()
	r.commitments[id] = s
	r.mu.Unlock()
	return s, nil
}
