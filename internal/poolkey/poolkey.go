// Package poolkey seals a runtime input's values to a pool of runtime nodes (SPEC 6.2, "Secrets in
// a pool"): HPKE (RFC 9180) with DHKEM(X25519), HKDF-SHA256 and ChaCha20-Poly1305, its info
// binding the pool, the worker UID and the delivery id. The Host holds only a pool's public key
// (from the catalog) and keeps the blob in PostgreSQL; every member node holds the private key
// (a 0600 file, as the Host holds its KEK) and opens the blob when the Host names the delivery to
// it, so a node that lost its state gets its secrets back without the Host opening anything again.
package poolkey

import (
	"crypto/ecdh"
	"crypto/hpke"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// fileFormat names the private key file's format; publicPrefix starts a public key's text.
const (
	fileFormat   = "takoform.pool-key.v1"
	publicPrefix = "x25519:"
	// blobVersion is a pool blob's first byte.
	blobVersion = 1
)

var (
	kem  = hpke.DHKEM(ecdh.X25519())
	kdf  = hpke.HKDFSHA256()
	aead = hpke.ChaCha20Poly1305()
)

// ErrNotForThis is an Open of a blob sealed for another pool, worker UID or delivery, under another
// key, or altered.
var ErrNotForThis = errors.New("the pool blob was not sealed to this pool's key for this worker and delivery, or was altered")

// Public is a pool's public key: what the Host seals to.
type Public struct{ key hpke.PublicKey }

// Private is a pool's private key and the pool's name: what every member node opens with.
type Private struct {
	Pool string
	key  hpke.PrivateKey
}

// Generate makes a new key pair for the pool named pool.
func Generate(pool string) (*Private, error) {
	if err := checkPool(pool); err != nil {
		return nil, err
	}
	k, err := kem.GenerateKey()
	if err != nil {
		return nil, err
	}
	return &Private{Pool: pool, key: k}, nil
}

func checkPool(pool string) error {
	if pool == "" || len(pool) > 128 || strings.ContainsAny(pool, "\x00\n") {
		return fmt.Errorf("pool name %q: 1 to 128 characters, no NUL or newline", pool)
	}
	return nil
}

// Public is p's public key.
func (p *Private) Public() Public { return Public{key: p.key.PublicKey()} }

// String is the public key as the catalog names it: "x25519:" and its 32 bytes in unpadded
// base64url.
func (k Public) String() string {
	return publicPrefix + base64.RawURLEncoding.EncodeToString(k.key.Bytes())
}

// ParsePublic reads a public key as String writes it.
func ParsePublic(s string) (Public, error) {
	rest, ok := strings.CutPrefix(s, publicPrefix)
	if !ok {
		return Public{}, fmt.Errorf("a pool public key starts with %q (takoserver nodes init-pool-key prints it)", publicPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil {
		return Public{}, fmt.Errorf("a pool public key is %q and unpadded base64url: %w", publicPrefix, err)
	}
	k, err := kem.NewPublicKey(b)
	if err != nil {
		return Public{}, fmt.Errorf("not an X25519 public key: %w", err)
	}
	return Public{key: k}, nil
}

// Valid reports whether k holds a key (the zero Public does not).
func (k Public) Valid() bool { return k.key != nil }

// Binding is what one blob is for: the worker UID and delivery id it was sealed to.
type Binding struct {
	WorkerUID  string
	DeliveryID string
}

func info(pool string, b Binding) []byte {
	return []byte("takoform.pool-delivery.v1\x00" + pool + "\x00" + b.WorkerUID + "\x00" + b.DeliveryID)
}

// Seal seals plaintext to the pool's public key for b. The Host cannot open the result.
func Seal(k Public, pool string, b Binding, plaintext []byte) ([]byte, error) {
	if !k.Valid() {
		return nil, errors.New("no pool public key")
	}
	if err := checkPool(pool); err != nil {
		return nil, err
	}
	ct, err := hpke.Seal(k.key, kdf, aead, info(pool, b), plaintext)
	if err != nil {
		return nil, err
	}
	return append([]byte{blobVersion}, ct...), nil
}

// Open opens a blob Seal made for p's pool and b.
func (p *Private) Open(b Binding, blob []byte) ([]byte, error) {
	if len(blob) < 1 || blob[0] != blobVersion {
		return nil, errors.New("not a pool blob of a version this node reads")
	}
	plain, err := hpke.Open(p.key, kdf, aead, info(p.Pool, b), blob[1:])
	if err != nil {
		return nil, ErrNotForThis
	}
	return plain, nil
}

type fileJSON struct {
	Format     string `json:"format"`
	Pool       string `json:"pool"`
	PrivateKey string `json:"privateKey"`
	PublicKey  string `json:"publicKey"`
}

// WriteFile writes p to path, a new 0600 file in a private (0700) directory; it never overwrites
// anything: the key is what opens every blob sealed to the pool.
func WriteFile(path string, p *Private) error {
	dir := filepath.Dir(path)
	if err := safedir.Check(dir, safedir.Current()); err != nil {
		return err
	}
	raw, err := p.key.Bytes()
	if err != nil {
		return err
	}
	data, err := json.Marshal(fileJSON{Format: fileFormat, Pool: p.Pool, PrivateKey: base64.StdEncoding.EncodeToString(raw), PublicKey: p.Public().String()})
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, safedir.FileMode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("%s already exists; a pool key file is never overwritten", path)
	}
	if err != nil {
		return err
	}
	if _, err := f.Write(append(data, '\n')); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// ReadFile reads a key WriteFile wrote, refusing a file that is not a 0600 regular file of this
// user's in a 0700 directory of this user's (SPEC 6.3).
func ReadFile(path string) (*Private, error) {
	data, err := safedir.ReadFile(filepath.Dir(path), filepath.Base(path), safedir.Current())
	if err != nil {
		return nil, fmt.Errorf("pool key file: %w", err)
	}
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil || f.Format != fileFormat {
		return nil, fmt.Errorf("pool key file %s: not a %s file (takoserver nodes init-pool-key writes one)", path, fileFormat)
	}
	if err := checkPool(f.Pool); err != nil {
		return nil, fmt.Errorf("pool key file %s: %w", path, err)
	}
	raw, err := base64.StdEncoding.DecodeString(f.PrivateKey)
	if err != nil {
		return nil, fmt.Errorf("pool key file %s: its private key is not base64", path)
	}
	k, err := kem.NewPrivateKey(raw)
	if err != nil {
		return nil, fmt.Errorf("pool key file %s: not an X25519 private key", path)
	}
	return &Private{Pool: f.Pool, key: k}, nil
}
