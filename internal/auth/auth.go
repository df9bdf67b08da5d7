// Package auth issues, stores and checks organization API keys. A key is shown once; only the
// SHA-256 of its secret is stored, and a revoked key stops working on the next request.
package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// Scopes an API key may carry.
const (
	ScopeRead  = "resources:read"
	ScopeWrite = "resources:write"
)

// AllScopes lists every scope, in a stable order.
var AllScopes = []string{ScopeRead, ScopeWrite}

// KeyPrefix starts every API key, so that secret scanners and people can recognise one.
const KeyPrefix = "tkf_"

var (
	keyShape = regexp.MustCompile(`^tkf_[a-z2-7]{52}$`)
	lower32  = base32.StdEncoding.WithPadding(base32.NoPadding)
)

// Organization is an organization as the API sees it.
type Organization struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

// Principal is who a request acts as: always exactly one organization, taken from the key.
type Principal struct {
	KeyID        string
	Organization Organization
	Scopes       []string
}

// Has reports whether the principal's key carries scope.
func (p Principal) Has(scope string) bool { return slices.Contains(p.Scopes, scope) }

// CreatedKey is a newly issued key; Key is the only time the secret exists outside the caller.
type CreatedKey struct {
	ID             string   `json:"id"`
	Key            string   `json:"key"`
	OrganizationID string   `json:"organizationId"`
	Scopes         []string `json:"scopes"`
	// ExpiresAt is when the key stops working (RFC 3339), when it was given a lifetime.
	ExpiresAt *string `json:"expiresAt,omitempty"`
}

// KeyInfo is what keys list shows of a key: never its secret nor the secret's hash.
type KeyInfo struct {
	ID           string   `json:"id"`
	Organization string   `json:"organization"`
	Scopes       []string `json:"scopes"`
	CreatedAt    string   `json:"createdAt"`
	RevokedAt    *string  `json:"revokedAt"`
	ExpiresAt    *string  `json:"expiresAt"`
	// LastUsedAt is the last request the key authenticated, to the minute (null: never used).
	LastUsedAt *string `json:"lastUsedAt"`
}

// ErrUnknownKey means the presented key is malformed, unknown or revoked.
var ErrUnknownKey = errors.New("unknown or revoked API key")

func randomToken(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return strings.ToLower(lower32.EncodeToString(b))
}

// NewID returns a random id with prefix, such as org_ or key_.
func NewID(prefix string) string { return prefix + randomToken(15) }

func hashSecret(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

// CreateOrganization creates an organization named name with a fresh immutable id.
func CreateOrganization(ctx context.Context, db dbsqlc.DBTX, name string) (Organization, error) {
	if !vocab.Name.MatchString(name) {
		return Organization{}, fmt.Errorf("organization name %q must match %s", name, vocab.NamePattern)
	}
	row, err := dbsqlc.New(db).OrganizationCreate(ctx, dbsqlc.OrganizationCreateParams{ID: NewID("org_"), Name: name})
	if store.IsUniqueViolation(err, "organizations_name_key") {
		return Organization{}, fmt.Errorf("organization %q already exists", name)
	}
	if err != nil {
		return Organization{}, fmt.Errorf("create organization: %w", store.Classify(err))
	}
	return Organization{ID: row.ID, Name: row.Name}, nil
}

// OrganizationByName looks an organization up by name.
func OrganizationByName(ctx context.Context, db dbsqlc.DBTX, name string) (Organization, error) {
	row, err := dbsqlc.New(db).OrganizationGetByName(ctx, name)
	if errors.Is(err, pgx.ErrNoRows) {
		return Organization{}, fmt.Errorf("no organization named %q", name)
	}
	if err != nil {
		return Organization{}, fmt.Errorf("look up organization: %w", store.Classify(err))
	}
	return Organization{ID: row.ID, Name: row.Name}, nil
}

// CreateKey issues a key for the organization named orgName with scopes (all scopes when empty)
// that never expires.
func CreateKey(ctx context.Context, db dbsqlc.DBTX, orgName string, scopes []string) (CreatedKey, error) {
	return CreateExpiringKey(ctx, db, orgName, scopes, 0)
}

// CreateExpiringKey is CreateKey with a lifetime: the key stops working that long after its
// creation (zero: never).
func CreateExpiringKey(ctx context.Context, db dbsqlc.DBTX, orgName string, scopes []string, lifetime time.Duration) (CreatedKey, error) {
	if lifetime < 0 {
		return CreatedKey{}, errors.New("a key's lifetime must be positive")
	}
	org, err := OrganizationByName(ctx, db, orgName)
	if err != nil {
		return CreatedKey{}, err
	}
	if len(scopes) == 0 {
		scopes = AllScopes
	}
	scopes = slices.Clone(scopes)
	slices.Sort(scopes)
	scopes = slices.Compact(scopes)
	for _, s := range scopes {
		if !slices.Contains(AllScopes, s) {
			return CreatedKey{}, fmt.Errorf("unknown scope %q (scopes: %s)", s, strings.Join(AllScopes, ", "))
		}
	}
	key := KeyPrefix + randomToken(32)
	out := CreatedKey{ID: NewID("key_"), Key: key, OrganizationID: org.ID}
	var expires *time.Time
	if lifetime > 0 {
		at := time.Now().Add(lifetime).UTC().Truncate(time.Second)
		expires = &at
	}
	row, err := dbsqlc.New(db).APIKeyCreate(ctx, dbsqlc.APIKeyCreateParams{ID: out.ID, OrganizationID: org.ID, SecretHash: hashSecret(key), Scopes: scopes, ExpiresAt: expires})
	if err != nil {
		return CreatedKey{}, fmt.Errorf("create key: %w", store.Classify(err))
	}
	out.ID, out.OrganizationID, out.Scopes, out.ExpiresAt = row.ID, row.OrganizationID, row.Scopes, stamp(row.ExpiresAt)
	return out, nil
}

// ListKeys lists every key, or those of the organization named orgName, oldest first.
func ListKeys(ctx context.Context, db dbsqlc.DBTX, orgName string) ([]KeyInfo, error) {
	var org *string
	if orgName != "" {
		org = &orgName
	}
	rows, err := dbsqlc.New(db).APIKeyList(ctx, org)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", store.Classify(err))
	}
	out := make([]KeyInfo, 0, len(rows))
	for _, r := range rows {
		out = append(out, KeyInfo{ID: r.ID, Organization: r.OrganizationName, Scopes: r.Scopes, CreatedAt: *stamp(&r.CreatedAt),
			RevokedAt: stamp(r.RevokedAt), ExpiresAt: stamp(r.ExpiresAt), LastUsedAt: stamp(r.LastUsedAt)})
	}
	return out, nil
}

// stamp is t in RFC 3339 (UTC), or nil.
func stamp(t *time.Time) *string {
	if t == nil {
		return nil
	}
	s := t.UTC().Format(time.RFC3339)
	return &s
}

// RevokeKey revokes the key with id. Revoking a revoked key succeeds.
func RevokeKey(ctx context.Context, db dbsqlc.DBTX, id string) error {
	_, err := dbsqlc.New(db).APIKeyRevoke(ctx, id)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("no API key %q", id)
	}
	if err != nil {
		return fmt.Errorf("revoke key: %w", err)
	}
	return nil
}

// Authenticate returns the principal of a presented key, or ErrUnknownKey.
func Authenticate(ctx context.Context, db dbsqlc.DBTX, key string) (Principal, error) {
	if !keyShape.MatchString(key) {
		return Principal{}, ErrUnknownKey
	}
	row, err := dbsqlc.New(db).APIKeyAuthenticate(ctx, hashSecret(key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Principal{}, ErrUnknownKey
	}
	if err != nil {
		return Principal{}, fmt.Errorf("authenticate: %w", store.Classify(err))
	}
	return Principal{KeyID: row.ID, Organization: Organization{ID: row.OrganizationID, Name: row.OrganizationName}, Scopes: row.Scopes}, nil
}

// Cache remembers keys that authenticated, for a short while, so that a busy Host does not ask the
// database on every request. A revoked key stops working within TTL on every replica. Only
// successful lookups are kept, by the key's hash; the zero value is ready to use.
type Cache struct {
	// TTL is how long a key that authenticated is trusted without asking again (one second when
	// zero; negative: every request asks).
	TTL time.Duration
	mu  sync.Mutex
	m   map[[32]byte]cached
}

type cached struct {
	p       Principal
	expires time.Time
}

// maxCached bounds the cache; past it the cache starts afresh.
const maxCached = 10000

// Authenticate is Authenticate through the cache.
func (c *Cache) Authenticate(ctx context.Context, db dbsqlc.DBTX, key string) (Principal, error) {
	if c.TTL < 0 {
		return Authenticate(ctx, db, key)
	}
	if !keyShape.MatchString(key) {
		return Principal{}, ErrUnknownKey
	}
	var h [32]byte
	copy(h[:], hashSecret(key))
	now := time.Now()
	c.mu.Lock()
	if e, ok := c.m[h]; ok && now.Before(e.expires) {
		c.mu.Unlock()
		return e.p, nil
	}
	c.mu.Unlock()
	p, err := Authenticate(ctx, db, key)
	if err != nil {
		return p, err
	}
	ttl := c.TTL
	if ttl <= 0 {
		ttl = time.Second
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= maxCached {
		c.m = map[[32]byte]cached{}
	}
	c.m[h] = cached{p: p, expires: now.Add(ttl)}
	c.mu.Unlock()
	return p, nil
}
