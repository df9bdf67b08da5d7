package sealing

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// MaxPreviousKeys bounds how many retired-from-sealing keys may still open rows sealed under them
// during a rotation. A key pushed out of the ring can no longer open anything.
const MaxPreviousKeys = 3

const ringFile = "sealing-keys.json"

// ErrUnknownKey means a row was sealed under a key that is no longer in the ring.
var ErrUnknownKey = errors.New("sealing key is not in the key ring (retired)")

// ErrOpen means a ciphertext failed authentication: corrupt, or moved to another row.
var ErrOpen = errors.New("sealed material failed authentication")

type keyFile struct {
	Current string            `json:"current"`
	Order   []string          `json:"order"` // oldest first
	Keys    map[string]string `json:"keys"`  // id -> base64 key
}

// Ring is the Host's sealing key ring: one current key that seals new rows and a bounded set of
// previous keys that may still open rows prepared or claimed before a rotation.
type Ring struct {
	mu      sync.RWMutex
	dir     string
	current string
	order   []string // oldest first; the last is current
	keys    map[string][]byte
}

var keyID = regexp.MustCompile(`^k[0-9]{14}-[0-9a-f]{8}$`)

// LoadRing opens the ring in dir (a private directory, SPEC 6.3), creating it with a fresh key on
// first start.
func LoadRing(dir string) (*Ring, error) {
	if err := safedir.Ensure(dir, safedir.Current()); err != nil {
		return nil, err
	}
	raw, err := safedir.ReadFile(dir, ringFile, safedir.Current())
	if errors.Is(err, fs.ErrNotExist) {
		r := &Ring{dir: dir, keys: map[string][]byte{}}
		if _, err := r.Rotate(); err != nil {
			return nil, err
		}
		return r, nil
	}
	if err != nil {
		return nil, err
	}
	var f keyFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("sealing key ring %s is unreadable", filepath.Join(dir, ringFile))
	}
	r := &Ring{dir: dir, current: f.Current, order: f.Order, keys: map[string][]byte{}}
	if len(f.Order) != len(f.Keys) {
		return nil, fmt.Errorf("sealing key ring %s is inconsistent", filepath.Join(dir, ringFile))
	}
	for id, enc := range f.Keys {
		k, err := base64.StdEncoding.DecodeString(enc)
		if err != nil || len(k) != 32 || !keyID.MatchString(id) {
			return nil, fmt.Errorf("sealing key ring %s holds a malformed key", filepath.Join(dir, ringFile))
		}
		r.keys[id] = k
	}
	if _, ok := r.keys[r.current]; !ok {
		return nil, fmt.Errorf("sealing key ring %s names a current key it does not hold", filepath.Join(dir, ringFile))
	}
	return r, nil
}

// Rotate makes a fresh key current, keeps at most MaxPreviousKeys previous keys, and writes the
// ring. It returns the new key's id.
func (r *Ring) Rotate() (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		return "", err
	}
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	id := fmt.Sprintf("k%s-%x", time.Now().UTC().Format("20060102150405"), suffix)
	keys := map[string][]byte{id: k}
	for old, v := range r.keys {
		keys[old] = v
	}
	ids := append(append([]string{}, r.order...), id)
	for len(ids) > MaxPreviousKeys+1 {
		delete(keys, ids[0])
		ids = ids[1:]
	}
	f := keyFile{Current: id, Order: ids, Keys: map[string]string{}}
	for _, i := range ids {
		f.Keys[i] = base64.StdEncoding.EncodeToString(keys[i])
	}
	raw, err := json.Marshal(f)
	if err != nil {
		return "", err
	}
	if err := safedir.WriteFile(r.dir, ringFile, raw, safedir.Current()); err != nil {
		return "", err
	}
	r.current, r.order, r.keys = id, ids, keys
	return id, nil
}

// Current is the id of the key that seals new rows.
func (r *Ring) Current() string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.current
}

func (r *Ring) key(id string) ([]byte, error) {
	r.mu.RLock()
	k, ok := r.keys[id]
	r.mu.RUnlock()
	if ok {
		return k, nil
	}
	// Another process may have rotated the ring: read it again before giving up.
	fresh, err := LoadRing(r.dir)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.current, r.order, r.keys = fresh.current, fresh.order, fresh.keys
	k, ok = r.keys[id]
	r.mu.Unlock()
	if !ok {
		return nil, ErrUnknownKey
	}
	return k, nil
}

// Sealed is a sealed value and how to open it.
type Sealed struct {
	KeyID      string
	Nonce      []byte
	Ciphertext []byte
}

// Seal encrypts plaintext under the current key with a fresh nonce, binding aad.
func (r *Ring) Seal(plaintext, aad []byte) (Sealed, error) {
	id := r.Current()
	k, err := r.key(id)
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
func (r *Ring) Open(s Sealed, aad []byte) ([]byte, error) {
	k, err := r.key(s.KeyID)
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

// Digest is the keyed digest (HMAC-SHA-256) of material under the digest key derived from keyID's
// sealing key: comparable with a digest of the backend's readback, useless to anyone without the
// ring.
func (r *Ring) Digest(keyID string, material []byte) ([]byte, error) {
	k, err := r.key(keyID)
	if err != nil {
		return nil, err
	}
	dk := hmac.New(sha256.New, k)
	dk.Write([]byte("takoform runtime-input digest key v1"))
	mac := hmac.New(sha256.New, dk.Sum(nil))
	mac.Write(material)
	return mac.Sum(nil), nil
}

func newGCM(k []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(k)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
