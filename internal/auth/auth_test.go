package auth_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// acme is a database with organization acme and one key of every scope.
func acme(t *testing.T) (*pgxpool.Pool, auth.CreatedKey) {
	t.Helper()
	db := testdb.Pool(t)
	_, err := auth.CreateOrganization(context.Background(), db, "acme")
	require.NoError(t, err)
	k, err := auth.CreateKey(context.Background(), db, "acme", nil)
	require.NoError(t, err)
	return db, k
}

// A key is shown once and only its hash is stored: the secret is nowhere in the database. It
// authenticates as its organization with its scopes, sorted and without repeats; an unknown scope
// is refused and issues nothing.
func TestAKeyIsStoredAsItsHashAndCarriesItsScopes(t *testing.T) {
	t.Parallel()
	db := testdb.Pool(t)
	ctx := context.Background()
	org, err := auth.CreateOrganization(ctx, db, "acme")
	require.NoError(t, err)
	k, err := auth.CreateKey(ctx, db, "acme", []string{auth.ScopeWrite, auth.ScopeRead, auth.ScopeWrite})
	require.NoError(t, err)
	require.Regexp(t, `^tkf_[a-z2-7]{52}$`, k.Key)
	require.Equal(t, []string{auth.ScopeRead, auth.ScopeWrite}, k.Scopes)

	var dump string
	require.NoError(t, db.QueryRow(ctx, `SELECT string_agg(t::text, '|') FROM api_keys t`).Scan(&dump))
	require.NotContains(t, dump, strings.TrimPrefix(k.Key, auth.KeyPrefix), "the secret is not stored")

	p, err := auth.Authenticate(ctx, db, k.Key)
	require.NoError(t, err)
	require.Equal(t, org, p.Organization)
	require.True(t, p.Has(auth.ScopeWrite))

	_, err = auth.CreateKey(ctx, db, "acme", []string{"resources:admin"})
	require.ErrorContains(t, err, `unknown scope "resources:admin"`)
	var keys int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM api_keys`).Scan(&keys))
	require.Equal(t, 1, keys, "a refused key issues nothing")

	readOnly, err := auth.CreateKey(ctx, db, "acme", []string{auth.ScopeRead})
	require.NoError(t, err)
	p, err = auth.Authenticate(ctx, db, readOnly.Key)
	require.NoError(t, err)
	require.False(t, p.Has(auth.ScopeWrite))
}

// Malformed, unknown and revoked keys are all the same error, which names no key.
func TestMalformedUnknownAndRevokedKeysAreOneError(t *testing.T) {
	t.Parallel()
	db, k := acme(t)
	ctx := context.Background()
	unknown := auth.KeyPrefix + strings.Repeat("a", 52)
	for name, key := range map[string]string{"empty": "", "malformed": "tkf_short", "upper case": strings.ToUpper(k.Key), "unknown": unknown} {
		_, err := auth.Authenticate(ctx, db, key)
		require.ErrorIs(t, err, auth.ErrUnknownKey, name)
	}
	require.NoError(t, auth.RevokeKey(ctx, db, k.ID))
	require.NoError(t, auth.RevokeKey(ctx, db, k.ID), "revoking twice succeeds")
	_, err := auth.Authenticate(ctx, db, k.Key)
	require.ErrorIs(t, err, auth.ErrUnknownKey)
	require.ErrorContains(t, auth.RevokeKey(ctx, db, "key_nothing"), `no API key "key_nothing"`)
}

// The cache trusts a key that authenticated for its TTL and no longer: a revocation is seen once
// the TTL has passed, and at once with caching off.
func TestTheCacheSeesARevocationWithinItsTTL(t *testing.T) {
	t.Parallel()
	db, k := acme(t)
	ctx := context.Background()

	cached := &auth.Cache{TTL: 2 * time.Second}
	uncached := &auth.Cache{TTL: -1}
	_, err := cached.Authenticate(ctx, db, k.Key)
	require.NoError(t, err)
	require.NoError(t, auth.RevokeKey(ctx, db, k.ID))
	_, err = cached.Authenticate(ctx, db, k.Key)
	require.NoError(t, err, "within its TTL the cache still trusts the key")
	_, err = uncached.Authenticate(ctx, db, k.Key)
	require.ErrorIs(t, err, auth.ErrUnknownKey, "without a cache the revocation is seen at once")
	require.Eventually(t, func() bool {
		_, err := cached.Authenticate(ctx, db, k.Key)
		return err != nil
	}, 15*time.Second, 50*time.Millisecond, "past its TTL the revocation is seen")

	// A malformed key is refused before any lookup, cached or not.
	_, err = cached.Authenticate(ctx, db, "not-a-key")
	require.ErrorIs(t, err, auth.ErrUnknownKey)
}

// A key given a lifetime stops working once it has passed (by the database's clock, as every
// replica's); keys list shows each key's expiry and last use, and never a secret or its hash.
func TestKeysExpireAndListTheirLastUse(t *testing.T) {
	t.Parallel()
	db, forever := acme(t)
	ctx := context.Background()
	brief, err := auth.CreateExpiringKey(ctx, db, "acme", []string{auth.ScopeRead}, time.Hour)
	require.NoError(t, err)
	require.NotNil(t, brief.ExpiresAt)
	_, err = auth.CreateExpiringKey(ctx, db, "acme", nil, -time.Hour)
	require.Error(t, err)

	_, err = auth.Authenticate(ctx, db, brief.Key)
	require.NoError(t, err, "within its lifetime")
	keys, err := auth.ListKeys(ctx, db, "acme")
	require.NoError(t, err)
	require.Len(t, keys, 2)
	byID := map[string]auth.KeyInfo{}
	for _, k := range keys {
		byID[k.ID] = k
	}
	require.Nil(t, byID[forever.ID].LastUsedAt, "never used")
	require.Nil(t, byID[forever.ID].ExpiresAt)
	require.NotNil(t, byID[brief.ID].LastUsedAt, "its use is recorded")
	require.Equal(t, brief.ExpiresAt, byID[brief.ID].ExpiresAt)
	dump := fmt.Sprintf("%+v", keys)
	require.NotContains(t, dump, strings.TrimPrefix(brief.Key, auth.KeyPrefix))

	_, err = db.Exec(ctx, `INSERT INTO clock_skew (skew) VALUES ('2 hours') ON CONFLICT (singleton) DO UPDATE SET skew = excluded.skew`)
	require.NoError(t, err)
	_, err = auth.Authenticate(ctx, db, brief.Key)
	require.ErrorIs(t, err, auth.ErrUnknownKey, "past its lifetime")
	_, err = auth.Authenticate(ctx, db, forever.Key)
	require.NoError(t, err)

	other, err := auth.ListKeys(ctx, db, "globex")
	require.NoError(t, err)
	require.Empty(t, other, "another organization's list")
}
