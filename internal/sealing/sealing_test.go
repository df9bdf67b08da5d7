package sealing

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/testdb"
)

const canary = "canary-4f1d2a9c7e"

func TestMain(m *testing.M) { testdb.Main(m) }

// kek writes a fresh key-encryption key file and loads it.
func kek(t *testing.T) KEK {
	t.Helper()
	path := filepath.Join(t.TempDir(), "sealing-key")
	k, err := WriteKEKFile(path)
	require.NoError(t, err)
	loaded, err := LoadKEK(path)
	require.NoError(t, err)
	require.Equal(t, k.ID, loaded.ID)
	return loaded
}

func TestSealOpensOnlyWithTheSameAAD(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	r, err := OpenRing(ctx, db, kek(t))
	require.NoError(t, err)
	aad := []byte(`{"org":"a","prep":"p1"}`)
	s, err := r.Seal(ctx, db, []byte(canary), aad)
	require.NoError(t, err)
	require.NotContains(t, string(s.Ciphertext), canary)
	got, err := r.Open(ctx, db, s, aad)
	require.NoError(t, err)
	require.Equal(t, canary, string(got))

	// Moved to another row (another AAD), it fails.
	_, err = r.Open(ctx, db, s, []byte(`{"org":"a","prep":"p2"}`))
	require.ErrorIs(t, err, ErrOpen)
	// Corrupt, it fails.
	bad := s
	bad.Ciphertext = append([]byte{}, s.Ciphertext...)
	bad.Ciphertext[0] ^= 1
	_, err = r.Open(ctx, db, bad, aad)
	require.ErrorIs(t, err, ErrOpen)
	// Two seals of the same value differ (fresh nonce).
	s2, err := r.Seal(ctx, db, []byte(canary), aad)
	require.NoError(t, err)
	require.NotEqual(t, s.Nonce, s2.Nonce)
	require.NotEqual(t, s.Ciphertext, s2.Ciphertext)
}

// TestEveryReplicaOpensWhatAnotherSealed: the ring lives in the database, so two replicas given the
// same key-encryption key open each other's rows; a replica given another key refuses to start.
func TestEveryReplicaOpensWhatAnotherSealed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	k := kek(t)
	a, err := OpenRing(ctx, db, k)
	require.NoError(t, err)
	b, err := OpenRing(ctx, db, k)
	require.NoError(t, err)
	s, err := a.Seal(ctx, db, []byte(canary), []byte("row"))
	require.NoError(t, err)
	got, err := b.Open(ctx, db, s, []byte("row"))
	require.NoError(t, err)
	require.Equal(t, canary, string(got))

	_, err = OpenRing(ctx, db, kek(t))
	require.ErrorContains(t, err, "cannot unwrap the current data key")
	require.ErrorContains(t, err, "same --sealing-key-file")
}

// TestADumpAloneOpensNothing: what the database holds of the ring is wrapped; nothing in it is a
// data key.
func TestADumpAloneOpensNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	k := kek(t)
	r, err := OpenRing(ctx, db, k)
	require.NoError(t, err)
	id, err := dbsqlc.New(db).SealingKeyCurrentID(ctx)
	require.NoError(t, err)
	data, err := r.key(ctx, db, id)
	require.NoError(t, err)
	var wrapped []byte
	require.NoError(t, db.QueryRow(ctx, "SELECT wrapped_key FROM sealing_keys WHERE id = $1", id).Scan(&wrapped))
	require.False(t, bytes.Contains(wrapped, data), "the stored key is wrapped")
}

func TestRotationKeepsABoundedSetOfPreviousKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	k := kek(t)
	r, err := OpenRing(ctx, db, k)
	require.NoError(t, err)
	aad := []byte("row")
	old, err := r.Seal(ctx, db, []byte(canary), aad)
	require.NoError(t, err)

	for i := range MaxPreviousKeys {
		id, _, err := Rotate(ctx, db, k)
		require.NoError(t, err)
		// The rotation is one write every replica sees on its next seal, with no restart.
		next, err := r.Seal(ctx, db, []byte(canary), aad)
		require.NoError(t, err)
		require.Equal(t, id, next.KeyID)
		got, err := r.Open(ctx, db, old, aad)
		require.NoError(t, err, "after %d rotations the old key still opens", i+1)
		require.Equal(t, canary, string(got))
	}
	_, retired, err := Rotate(ctx, db, k)
	require.NoError(t, err)
	require.Equal(t, 1, retired)
	_, err = r.Open(ctx, db, old, aad)
	require.ErrorIs(t, err, ErrUnknownKey, "a retired key opens nothing, even on a replica that had it cached")
	_, err = r.Challenge(ctx, db, old.KeyID, "prep", uuid.New())
	require.ErrorIs(t, err, ErrUnknownKey)
}

func TestKeyFileIsPrivateNeverOverwrittenAndChecked(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "sealing-key")
	_, err := WriteKEKFile(path)
	require.NoError(t, err)
	info, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	_, err = WriteKEKFile(path)
	require.ErrorContains(t, err, "never overwritten")

	require.NoError(t, os.Chmod(path, 0o644))
	_, err = LoadKEK(path)
	require.ErrorContains(t, err, "readable by its owner only")
	bad := filepath.Join(t.TempDir(), "bad")
	require.NoError(t, os.WriteFile(bad, []byte("not base64 at all\n"), 0o600))
	_, err = LoadKEK(bad)
	require.ErrorContains(t, err, "32 bytes")
	_, err = LoadKEK("")
	require.ErrorContains(t, err, "keys init-sealing")
}

func TestReadbackDigestIsKeyedByTheChallenge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	r, err := OpenRing(ctx, db, kek(t))
	require.NoError(t, err)
	id, err := dbsqlc.New(db).SealingKeyCurrentID(ctx)
	require.NoError(t, err)
	ms := uuid.New()
	c1, err := r.Challenge(ctx, db, id, "prep-1", ms)
	require.NoError(t, err)
	again, err := r.Challenge(ctx, db, id, "prep-1", ms)
	require.NoError(t, err)
	c2, err := r.Challenge(ctx, db, id, "prep-2", ms)
	require.NoError(t, err)
	c3, err := r.Challenge(ctx, db, id, "prep-1", uuid.New())
	require.NoError(t, err)
	require.Equal(t, c1, again)
	require.NotEqual(t, c1, c2)
	require.NotEqual(t, c1, c3)
	d := Digest(c1, []byte(canary))
	require.Equal(t, d, Digest(again, []byte(canary)))
	require.NotEqual(t, d, Digest(c2, []byte(canary)), "another challenge gives another digest")
	require.NotEqual(t, d, Digest(c1, []byte("other")))
}

// A re-wrap under a new key-encryption key (a leaked one retired) keeps everything sealed
// openable: a replica started with the new key opens what was sealed before and answers the
// same commitment keys, one still running with the old key keeps serving from what it unwrapped
// at start, one started with the old key afterwards is refused, a second re-wrap changes nothing,
// and a key wrapped under a third key-encryption key refuses the whole re-wrap.
func TestARewrapUnderANewKEKKeepsEverythingOpenable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	old, next := kek(t), kek(t)
	running, err := OpenRing(ctx, db, old)
	require.NoError(t, err)
	aad := []byte(`{"org":"a","prep":"p1"}`)
	sealed, err := running.Seal(ctx, db, []byte(canary), aad)
	require.NoError(t, err)
	secretID, before, err := running.CommitmentKey(ctx, db, "org_a", "n-1")
	require.NoError(t, err)
	_, _, err = Rotate(ctx, db, old) // two data keys: the current and a previous one
	require.NoError(t, err)

	n, err := Rewrap(ctx, db, old, next)
	require.NoError(t, err)
	require.Equal(t, 4, n, "two data keys, the commitment secret and the domain challenge secret")
	var under int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*) FROM sealing_keys WHERE wrapped_key IS NOT NULL AND kek_id <> $1`, next.ID).Scan(&under))
	require.Zero(t, under)

	fresh, err := OpenRing(ctx, db, next)
	require.NoError(t, err)
	got, err := fresh.Open(ctx, db, sealed, aad)
	require.NoError(t, err)
	require.Equal(t, canary, string(got))
	id, after, err := fresh.CommitmentKey(ctx, db, "org_a", "n-1")
	require.NoError(t, err)
	require.Equal(t, secretID, id)
	require.Equal(t, before, after, "the commitment keys are the same: references computed before still check")
	require.Equal(t, running.DomainChallenge("org_a", "app.example.com"), fresh.DomainChallenge("org_a", "app.example.com"),
		"a custom domain's TXT value is the same: published records still verify")
	require.NotEqual(t, fresh.DomainChallenge("org_a", "app.example.com"), fresh.DomainChallenge("org_b", "app.example.com"))

	got, err = running.Open(ctx, db, sealed, aad)
	require.NoError(t, err, "a replica still on the old key keeps serving")
	require.Equal(t, canary, string(got))
	_, err = OpenRing(ctx, db, old)
	require.ErrorContains(t, err, "cannot unwrap", "a replica started on the old key is refused")

	n, err = Rewrap(ctx, db, old, next)
	require.NoError(t, err)
	require.Zero(t, n, "a second run changes nothing")

	third := kek(t)
	_, err = Rewrap(ctx, db, next, third)
	require.NoError(t, err)
	_, err = Rewrap(ctx, db, old, next)
	require.ErrorContains(t, err, "neither the current")
	_, err = Rewrap(ctx, db, next, next)
	require.ErrorContains(t, err, "is the current one")
}

// A rotation is a compare-and-swap on the key-encryption key, in the database: a rotation that
// opened the ring under a key-encryption key a re-wrap has since retired (the race the help text
// warns of) demotes nothing and writes no key, rather than leaving a new data key under the
// retired key-encryption key.
func TestARotationRacingARewrapWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	old, next := kek(t), kek(t)
	_, err := OpenRing(ctx, db, old)
	require.NoError(t, err)
	_, err = Rewrap(ctx, db, old, next)
	require.NoError(t, err)
	// What Rotate sends once it has opened the ring under old, after the re-wrap committed.
	r := &Ring{kek: old}
	id := newKeyID()
	wrapped, err := r.wrap(id, randomKey())
	require.NoError(t, err)
	row, err := dbsqlc.New(db).SealingKeyRotate(ctx, dbsqlc.SealingKeyRotateParams{ID: id, KEKID: old.ID, WrappedKey: wrapped, MaxPrevious: MaxPreviousKeys})
	require.NoError(t, err)
	require.Zero(t, row.DemotedCount)
	var keys, underOld int
	require.NoError(t, db.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE kek_id = $1) FROM sealing_keys`, old.ID).Scan(&keys, &underOld))
	require.Equal(t, 1, keys, "no key was added")
	require.Zero(t, underOld, "none is under the retired key-encryption key")
	_, err = OpenRing(ctx, db, next)
	require.NoError(t, err, "the ring still opens under the new key-encryption key")
}
