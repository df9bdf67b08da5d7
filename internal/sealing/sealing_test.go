package sealing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

const canary = "canary-4f1d2a9c7e"

func TestSecretRedactsItselfEverywhere(t *testing.T) {
	t.Parallel()
	s := NewSecret(canary)
	type holder struct {
		Value Secret
		Ptr   *Secret
	}
	h := holder{Value: s, Ptr: &s}
	var out []string
	for _, f := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x", "%d"} {
		out = append(out, fmt.Sprintf(f, s), fmt.Sprintf(f, h))
	}
	out = append(out, fmt.Sprint(s), fmt.Sprintln(h), s.String(), s.GoString())
	raw, err := json.Marshal(h)
	require.NoError(t, err)
	out = append(out, string(raw))
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "secret", s, "holder", h)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "secret", s)
	out = append(out, logs.String())
	for _, o := range out {
		require.NotContains(t, o, canary)
		require.NotContains(t, o, "4f1d2a9c7e")
	}
	require.Equal(t, canary, s.Reveal())

	var decoded struct{ V Secret }
	require.NoError(t, json.Unmarshal([]byte(`{"V":"`+canary+`"}`), &decoded))
	require.Equal(t, canary, decoded.V.Reveal())
	require.Error(t, json.Unmarshal([]byte(`{"V":1}`), &decoded))
}

func ring(t *testing.T) *Ring {
	t.Helper()
	r, err := LoadRing(filepath.Join(t.TempDir(), "keys"))
	require.NoError(t, err)
	return r
}

func TestSealOpensOnlyWithTheSameAAD(t *testing.T) {
	t.Parallel()
	r := ring(t)
	aad := []byte(`{"org":"a","prep":"p1"}`)
	s, err := r.Seal([]byte(canary), aad)
	require.NoError(t, err)
	require.NotContains(t, string(s.Ciphertext), canary)
	got, err := r.Open(s, aad)
	require.NoError(t, err)
	require.Equal(t, canary, string(got))

	// Moved to another row (another AAD), it fails.
	_, err = r.Open(s, []byte(`{"org":"a","prep":"p2"}`))
	require.ErrorIs(t, err, ErrOpen)
	// Corrupt, it fails.
	bad := s
	bad.Ciphertext = append([]byte{}, s.Ciphertext...)
	bad.Ciphertext[0] ^= 1
	_, err = r.Open(bad, aad)
	require.ErrorIs(t, err, ErrOpen)
	// Two seals of the same value differ (fresh nonce).
	s2, err := r.Seal([]byte(canary), aad)
	require.NoError(t, err)
	require.NotEqual(t, s.Nonce, s2.Nonce)
	require.NotEqual(t, s.Ciphertext, s2.Ciphertext)
}

func TestRotationKeepsABoundedSetOfPreviousKeys(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	r, err := LoadRing(dir)
	require.NoError(t, err)
	aad := []byte("row")
	old, err := r.Seal([]byte(canary), aad)
	require.NoError(t, err)

	for i := range MaxPreviousKeys {
		_, err := r.Rotate()
		require.NoError(t, err)
		// A reloaded ring (another Host process) opens the old row too.
		again, err := LoadRing(dir)
		require.NoError(t, err)
		got, err := again.Open(old, aad)
		require.NoError(t, err, "after %d rotations the old key still opens", i+1)
		require.Equal(t, canary, string(got))
	}
	_, err = r.Rotate()
	require.NoError(t, err)
	_, err = r.Open(old, aad)
	require.ErrorIs(t, err, ErrUnknownKey, "a retired key opens nothing")
	_, err = r.Digest(old.KeyID, []byte(canary))
	require.ErrorIs(t, err, ErrUnknownKey)
}

func TestRingFilesArePrivateAndUnsafeDirsRefused(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "keys")
	_, err := LoadRing(dir)
	require.NoError(t, err)
	info, err := os.Stat(filepath.Join(dir, ringFile))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), info.Mode().Perm())
	raw, err := os.ReadFile(filepath.Join(dir, ringFile))
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary)

	open := filepath.Join(t.TempDir(), "open")
	require.NoError(t, os.Mkdir(open, 0o755))
	require.NoError(t, os.Chmod(open, 0o755))
	_, err = LoadRing(open)
	require.ErrorContains(t, err, "refusing unsafe private path")
}

func TestDigestIsKeyed(t *testing.T) {
	t.Parallel()
	a, b := ring(t), ring(t)
	da, err := a.Digest(a.Current(), []byte(canary))
	require.NoError(t, err)
	da2, err := a.Digest(a.Current(), []byte(canary))
	require.NoError(t, err)
	db, err := b.Digest(b.Current(), []byte(canary))
	require.NoError(t, err)
	other, err := a.Digest(a.Current(), []byte("other"))
	require.NoError(t, err)
	require.Equal(t, da, da2)
	require.NotEqual(t, da, db, "another ring's digest differs")
	require.NotEqual(t, da, other)
}
