package sealing

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// MaxPreviousKeys bounds how many retired-from-sealing keys may still open rows sealed under them
// during a rotation. A key pushed out of the ring is destroyed and opens nothing.
const MaxPreviousKeys = 3

// ErrUnknownKey means a row was sealed under a key that is no longer in the ring.
var ErrUnknownKey = errors.New("sealing key is not in the key ring (retired)")

// ErrOpen means a ciphertext failed authentication: corrupt, or moved to another row.
var ErrOpen = errors.New("sealed material failed authentication")

// KEK is the key-encryption key every Host replica is given by its operator (SPEC 3.5): it wraps
// the data keys stored in PostgreSQL, so that a database dump alone opens nothing.
type KEK struct {
	key []byte
	// ID is a fingerprint of the key, safe to print and store, so that a replica given another
	// key can say so.
	ID string
}

func newKEK(key []byte) KEK {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("takoform key-encryption key id v1"))
	return KEK{key: key, ID: hex.EncodeToString(mac.Sum(nil))[:16]}
}

// LoadKEK reads a key-encryption key file: one line of standard base64 holding 32 bytes. The file
// must be a regular file that no group or other user can read.
func LoadKEK(path string) (KEK, error) {
	if path == "" {
		return KEK{}, errors.New("no sealing key: pass --sealing-key-file or set TAKOSERVER_SEALING_KEY_FILE (create one with `takoserver keys init-sealing --out FILE`)")
	}
	fi, err := os.Lstat(path)
	if err != nil {
		return KEK{}, fmt.Errorf("sealing key file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return KEK{}, fmt.Errorf("sealing key file %s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return KEK{}, fmt.Errorf("sealing key file %s has mode %04o; it must be readable by its owner only (0600)", path, fi.Mode().Perm())
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return KEK{}, fmt.Errorf("sealing key file: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil || len(key) != 32 {
		return KEK{}, fmt.Errorf("sealing key file %s must hold 32 bytes as one line of standard base64", path)
	}
	return newKEK(key), nil
}

// WriteKEKFile writes a fresh key-encryption key to path with mode 0600. It refuses to overwrite
// anything: losing a key-encryption key loses every sealed row.
func WriteKEKFile(path string) (KEK, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return KEK{}, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return KEK{}, fmt.Errorf("%s already exists; a sealing key file is never overwritten", path)
	}
	if err != nil {
		return KEK{}, err
	}
	if _, err := f.WriteString(base64.StdEncoding.EncodeToString(key) + "\n"); err != nil {
		f.Close()
		return KEK{}, err
	}
	if err := f.Close(); err != nil {
		return KEK{}, err
	}
	return newKEK(key), nil
}

// Ring is the sealing key ring as one Host replica sees it: the data keys in PostgreSQL, unwrapped
// with the replica's key-encryption key and cached. Which key is current is read from the
// database on every seal, so a rotation reaches every replica on its next use.
type Ring struct {
	db  dbsqlc.DBTX
	kek KEK
	mu  sync.RWMutex
	// keys caches unwrapped data keys by id; a retired key is dropped when the database says so.
	keys map[string][]byte
	// commitments caches unwrapped runtime-input commitment secrets by id (they never retire).
	commitments map[string][]byte
	// hostSecrets holds the unwrapped Host secrets by name, read at open (they never rotate).
	hostSecrets map[string][]byte
}

// OpenRing opens the ring in the database, creating its first data key when it has none. It
// refuses when kek cannot unwrap the current data key: a replica must never seal under a key
// nobody else has.
func OpenRing(ctx context.Context, db dbsqlc.DBTX, kek KEK) (*Ring, error) {
	r := &Ring{db: db, kek: kek, keys: map[string][]byte{}, commitments: map[string][]byte{}, hostSecrets: map[string][]byte{}}
	q := dbsqlc.New(db)
	id := newKeyID()
	wrapped, err := r.wrap(id, randomKey())
	if err != nil {
		return nil, err
	}
	if _, err := q.SealingKeyInit(ctx, dbsqlc.SealingKeyInitParams{ID: id, KEKID: kek.ID, WrappedKey: wrapped}); err != nil {
		return nil, fmt.Errorf("sealing: create the first data key: %w", store.Classify(err))
	}
	rows, err := q.SealingKeysOpenable(ctx)
	if err != nil {
		return nil, fmt.Errorf("sealing: read the key ring: %w", store.Classify(err))
	}
	for _, row := range rows {
		key, err := r.unwrap(row.ID, row.WrappedKey)
		if err != nil {
			if row.Status == dbsqlc.SealingKeyStatusCurrent {
				return nil, fmt.Errorf("sealing: this Host's key-encryption key (id %s) cannot unwrap the current data key %s, which was wrapped by key-encryption key %s; give every Host replica the same --sealing-key-file",
					kek.ID, row.ID, row.KEKID)
			}
			continue // a previous key wrapped elsewhere opens nothing here, and fails closed when asked
		}
		r.keys[row.ID] = key
	}
	if err := r.initCommitmentSecret(ctx, q); err != nil {
		return nil, err
	}
	if err := r.initHostSecret(ctx, q, DomainChallengeSecret); err != nil {
		return nil, err
	}
	return r, nil
}

// Rotate makes a fresh data key current in one database write: the old current key stays able to
// open rows sealed under it, and previous keys beyond MaxPreviousKeys are destroyed. It returns
// the new key's id and how many keys it retired.
func Rotate(ctx context.Context, db dbsqlc.DBTX, kek KEK) (string, int, error) {
	r := &Ring{kek: kek}
	if _, err := OpenRing(ctx, db, kek); err != nil {
		return "", 0, err
	}
	id := newKeyID()
	wrapped, err := r.wrap(id, randomKey())
	if err != nil {
		return "", 0, err
	}
	row, err := dbsqlc.New(db).SealingKeyRotate(ctx, dbsqlc.SealingKeyRotateParams{ID: id, KEKID: kek.ID, WrappedKey: wrapped, MaxPrevious: MaxPreviousKeys})
	if err != nil {
		return "", 0, fmt.Errorf("sealing: rotate: %w", store.Classify(err))
	}
	if row.DemotedCount == 0 {
		return "", 0, fmt.Errorf("sealing: the current data key is no longer wrapped by this key-encryption key (id %s): the ring was re-wrapped meanwhile (keys rewrap); rotate with the new key file. Nothing was written", kek.ID)
	}
	return id, int(row.RetiredCount), nil
}

func newKeyID() string {
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	return fmt.Sprintf("k%s-%x", time.Now().UTC().Format("20060102150405"), suffix)
}

func randomKey() []byte {
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		panic(err)
	}
	return k
}

func wrapAAD(id string) []byte { return []byte("takoform sealing data key v1\x00" + id) }

func (r *Ring) wrap(id string, key []byte) ([]byte, error) { return r.wrapAs(wrapAAD(id), key) }

func (r *Ring) unwrap(id string, wrapped []byte) ([]byte, error) {
	return r.unwrapAs(wrapAAD(id), wrapped)
}

// wrapAs wraps a 32-byte key under the key-encryption key, bound to aad.
func (r *Ring) wrapAs(aad, key []byte) ([]byte, error) {
	aead, err := newGCM(r.kek.key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, key, aad), nil
}

func (r *Ring) unwrapAs(aad, wrapped []byte) ([]byte, error) {
	aead, err := newGCM(r.kek.key)
	if err != nil {
		return nil, err
	}
	if len(wrapped) < aead.NonceSize() {
		return nil, ErrOpen
	}
	key, err := aead.Open(nil, wrapped[:aead.NonceSize()], wrapped[aead.NonceSize():], aad)
	if err != nil || len(key) != 32 {
		return nil, ErrOpen
	}
	return key, nil
}

// key returns data key id, from the cache or the database. A key the database no longer holds
// as openable is ErrUnknownKey, even if this replica had it cached.
func (r *Ring) key(ctx context.Context, q dbsqlc.DBTX, id string) ([]byte, error) {
	rows, err := dbsqlc.New(q).SealingKeysOpenable(ctx)
	if err != nil {
		return nil, fmt.Errorf("sealing: read the key ring: %w", store.Classify(err))
	}
	for _, row := range rows {
		if row.ID != id {
			continue
		}
		r.mu.RLock()
		k, ok := r.keys[id]
		r.mu.RUnlock()
		if ok {
			return k, nil
		}
		k, err := r.unwrap(row.ID, row.WrappedKey)
		if err != nil {
			return nil, ErrUnknownKey
		}
		r.mu.Lock()
		r.keys[id] = k
		r.mu.Unlock()
		return k, nil
	}
	r.mu.Lock()
	delete(r.keys, id)
	r.mu.Unlock()
	return nil, ErrUnknownKey
}

// Sealed is a sealed value and how to open it.
type Sealed struct {
	KeyID      string
	Nonce      []byte
	Ciphertext []byte
}

// Seal encrypts plaintext under the current data key with a fresh nonce, binding aad. q is the
// caller's transaction (or the pool).
func (r *Ring) Seal(ctx context.Context, q dbsqlc.DBTX, plaintext, aad []byte) (Sealed, error) {
	id, err := dbsqlc.New(q).SealingKeyCurrentID(ctx)
	if errors.Is(err, pgx.ErrNoRows) {
		return Sealed{}, errors.New("sealing: the key ring has no current key")
	}
	if err != nil {
		return Sealed{}, fmt.Errorf("sealing: current key: %w", store.Classify(err))
	}
	k, err := r.key(ctx, q, id)
	if err != nil {
		return Sealed{}, err
	}
	aead, err := newGCM(k)
	if err != nil {
		return Sealed{}, err
	}
	nonce := make([]byte, aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, err
	}
	return Sealed{KeyID: id, Nonce: nonce, Ciphertext: aead.Seal(nil, nonce, plaintext, aad)}, nil
}

// Open decrypts s, which must have been sealed with the same aad under a key still in the ring.
func (r *Ring) Open(ctx context.Context, q dbsqlc.DBTX, s Sealed, aad []byte) ([]byte, error) {
	k, err := r.key(ctx, q, s.KeyID)
	if err != nil {
		return nil, err
	}
	aead, err := newGCM(k)
	if err != nil {
		return nil, err
	}
	if len(s.Nonce) != aead.NonceSize() {
		return nil, ErrOpen
	}
	out, err := aead.Open(nil, s.Nonce, s.Ciphertext, aad)
	if err != nil {
		return nil, ErrOpen
	}
	return out, nil
}

// Challenge is the readback challenge of one preparation (SPEC 3.5): c = HMAC(data key keyID,
// preparation id ‖ material-set id). It is derived whenever it is needed and never stored, so the
// stored digest alone gives nothing to brute-force.
func (r *Ring) Challenge(ctx context.Context, q dbsqlc.DBTX, keyID, preparationID string, materialSetID uuid.UUID) ([]byte, error) {
	k, err := r.key(ctx, q, keyID)
	if err != nil {
		return nil, err
	}
	mac := hmac.New(sha256.New, k)
	mac.Write([]byte("takoform runtime-input readback challenge v1\x00"))
	mac.Write([]byte(preparationID))
	mac.Write([]byte{0})
	mac.Write(materialSetID[:])
	return mac.Sum(nil), nil
}

// Digest is the readback digest d = HMAC-SHA256(challenge, material): what the Host stores at
// sealing and what a backend answers when given the challenge.
func Digest(challenge, material []byte) []byte {
	mac := hmac.New(sha256.New, challenge)
	mac.Write(material)
	return mac.Sum(nil)
}

func newGCM(k []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
