package sealing

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// DomainChallengeSecret names the Host secret custom-domain TXT values are made under (SPEC 3.7).
// It never rotates: a record a user published stays valid for as long as the database lives, so
// that deleting and claiming a domain again needs no new record.
const DomainChallengeSecret = "custom-domain-challenge"

// hostSecretAAD binds a wrapped Host secret to its name: never interchangeable with a data key, a
// commitment secret, or another Host secret.
func hostSecretAAD(name string) []byte { return []byte("takoform host secret v1\x00" + name) }

// initHostSecret creates the Host secret name when the database has none, and unwraps it once,
// refusing a key-encryption key that cannot.
func (r *Ring) initHostSecret(ctx context.Context, q *dbsqlc.Queries, name string) error {
	wrapped, err := r.wrapAs(hostSecretAAD(name), randomKey())
	if err != nil {
		return err
	}
	if _, err := q.HostSecretInit(ctx, dbsqlc.HostSecretInitParams{Name: name, KEKID: r.kek.ID, WrappedSecret: wrapped}); err != nil {
		return fmt.Errorf("sealing: create the Host secret %s: %w", name, store.Classify(err))
	}
	row, err := q.HostSecretGet(ctx, name)
	if err != nil {
		return fmt.Errorf("sealing: read the Host secret %s: %w", name, store.Classify(err))
	}
	secret, err := r.unwrapAs(hostSecretAAD(name), row.WrappedSecret)
	if err != nil {
		return fmt.Errorf("sealing: this Host's key-encryption key (id %s) cannot unwrap the Host secret %s, which was wrapped by key-encryption key %s; give every Host replica the same --sealing-key-file",
			r.kek.ID, name, row.KEKID)
	}
	r.mu.Lock()
	r.hostSecrets[name] = secret
	r.mu.Unlock()
	return nil
}

// DomainChallenge is the TXT value that proves organization org controls hostname (SPEC 3.7):
// HMAC-SHA256 under the domain challenge secret over the organization's id and the hostname (a
// wildcard's, "*." included), hex. It is public by design: it says nothing of the secret.
func (r *Ring) DomainChallenge(org, hostname string) string {
	r.mu.RLock()
	secret := r.hostSecrets[DomainChallengeSecret]
	r.mu.RUnlock()
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("takoform custom domain v1\x00" + org + "\x00" + hostname))
	return hex.EncodeToString(mac.Sum(nil))
}
