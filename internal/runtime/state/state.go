// Package state keeps the runtime node's private files (SPEC 5, 5.1, 6.3): its admin token, its
// desired state and the sealed secret deliveries inside one 0700 state directory whose files are
// 0600, and its own sealing key in a file outside it (SealingKey). An unsafe existing path is
// refused, never repaired.
//
// Layout:
//
//	<sealing-key-file>      32 random bytes (standard base64): seals deliveries, keys digests;
//	                        never inside the state directory
//	<state-dir>/            0700
//	  lock                  held (flock) while a node runs, so two nodes never share the directory
//	  admin-token           the admin API's bearer token (256 random bits, hex)
//	  desired.json          scripts, routes, brakes, delivery metadata, recent effect ids
//	  bundles/<sha256>      one set of modules, named by the digest of its content, for every
//	                        script (and admitted incumbent) desired.json names it for
//	  secrets/<workerUid>   one sealed delivery per worker UID (AES-256-GCM)
//	  incarnations/         one private directory per running incarnation (config and modules)
package state

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// IsolateVersion is the first desired-state version whose admitted incarnations are named by
// their isolate identity: a state of an earlier version has its admissions moved by the runtime.
const IsolateVersion = 3

const (
	desiredFile = "desired.json"
	// MembershipFile keeps the node's place in its pool (SPEC 6.2), as the Host last told it.
	MembershipFile = "membership.json"
	// ImplicationsFile keeps the implications of the node's incarnations in kills and aborts of
	// their processes, and their quarantines (SPEC 5.1), across the node's restarts.
	ImplicationsFile = "implications.json"
	lockFile         = "lock"
	secretsDir       = "secrets"
	socketsDir       = "sockets"
	bundlesDir       = "bundles"
	// legacyIncarnationsDir held one directory per running incarnation, in the runtime before org
	// processes; a start removes it.
	legacyIncarnationsDir = "incarnations"
	// desiredVersion 4 keeps a journal beside desired.json (journal.go); 3 names admitted
	// incarnations by their isolate identity; version 2 (the process-per-incarnation identities,
	// modules in bundles/) and 1 (modules inline) are still read, and the runtime moves their
	// admitted incarnations to its identities (IsolateVersion).
	desiredVersion   = 4
	sealedFileFormat = "takoform.runtime-sealed-delivery.v1"
)

// Desired is everything the node must serve, persisted so that a node restarted with no Host
// serves the same workers again.
type Desired struct {
	Version int                    `json:"version"`
	Scripts map[string]*Script     `json:"scripts"`
	Routes  map[string]*Route      `json:"routes"`
	Brakes  []adminapi.BrakeScope  `json:"brakes"`
	Effects map[string]EffectEntry `json:"effects"`
	// Floors keeps, per script name, the highest generation deleted there: the Host's generations
	// increase across worker UIDs, so a late PUT from a deleted or replaced worker never brings its
	// script back.
	Floors map[string]int64 `json:"floors,omitempty"`
	// Refused keeps the deliveries a readback concluded absent, with when, so that a late copy of
	// one is refused rather than delivered after its lease failed (kept desired.RefusedFor).
	Refused map[string]time.Time `json:"refused,omitempty"`
	// OrgUIDs keeps the sandbox uid of each organization (by its label), so that an organization
	// runs as the same uid across restarts and a uid never passes to another (SPEC 5.1).
	OrgUIDs map[string]int `json:"orgUids,omitempty"`

	// changes names what a derivation of this state wrote (changes.go), nil for a state that
	// was not derived; saved numbers the save that wrote this very state (0: none did).
	changes *changes
	saved   uint64
}

// Script is one script's desired deployment and the metadata of its delivery.
type Script struct {
	Name         string          `json:"name"`
	WorkerUID    string          `json:"workerUid"`
	DeploymentID string          `json:"deploymentId"`
	Generation   int64           `json:"generation"`
	Labels       adminapi.Labels `json:"labels"`
	// Modules are kept in bundles/ (desired.json names them by digest) and read on demand.
	Modules           Code   `json:"-"`
	MainModule        string `json:"mainModule"`
	CompatibilityDate string `json:"compatibilityDate"`
	workerconf.Settings
	SecretNames  []string  `json:"secretNames"`
	BundleDigest string    `json:"bundleDigest"`
	Delivery     *Delivery `json:"delivery"`
	// Admitted is the incarnation that has served: continuity restarts exactly it, also after the
	// node itself restarts, while a newer candidate that never served is only attempted.
	Admitted string `json:"admitted"`
	// Serving is what the admitted incarnation runs, kept when a newer deployment replaces the
	// desired content above, so that a restarted node serves the incumbent again while the newer
	// one is still (or again) only a candidate.
	Serving *Served `json:"serving,omitempty"`
}

// Served is the content of an admitted incarnation. Its values are the delivery DeliveryID,
// while that delivery is still held.
type Served struct {
	DeploymentID      string `json:"deploymentId"`
	Generation        int64  `json:"generation"`
	Modules           Code   `json:"-"`
	MainModule        string `json:"mainModule"`
	CompatibilityDate string `json:"compatibilityDate"`
	workerconf.Settings
	DeliveryID string `json:"deliveryId,omitempty"`
}

// Delivery is the value-free record of a script's delivered secrets; the values are in the sealed
// file of its worker UID.
type Delivery struct {
	DeliveryID string   `json:"deliveryId"`
	WorkerUID  string   `json:"workerUid"`
	Names      []string `json:"names"`
	// ValuesMAC is a keyed digest of the values under the runtime's key: it enters the incarnation
	// identity, and tells two deliveries apart without any reusable digest of a secret.
	ValuesMAC string `json:"valuesMac"`
}

// Route maps one hostname to a script for one endpoint UID.
type Route struct {
	Hostname     string `json:"hostname"`
	ScriptName   string `json:"scriptName"`
	EndpointUID  string `json:"endpointUid"`
	DeploymentID string `json:"deploymentId"`
}

// EffectEntry remembers one applied effect id: what it was applied to and a keyed digest of its
// request, so a replay is recognised and a conflicting reuse refused.
type EffectEntry struct {
	Target     string    `json:"target"`
	RequestMAC string    `json:"requestMac"`
	At         time.Time `json:"at"`
}

// Store is an open state directory. Only one node at a time may hold it.
type Store struct {
	dir     string
	owner   safedir.Owner
	token   string
	sealKey []byte
	// previousSealKey opens deliveries sealed before a rotation (nil: none).
	previousSealKey []byte
	// previousMacKey recognises the effects recorded before a rotation (nil: none).
	previousMacKey []byte
	// Resealed counts the deliveries Open sealed again under a new key.
	Resealed int
	macKey   []byte
	lock     *os.File
	// movedKey is the legacy key file the dev path moved out at Open, if any.
	movedKey string

	// saveMu orders saves. onDisk is the names of the files in bundles/; scripts what the last
	// save (or the load) knows of each script; refs how many modules of the last save's state
	// each bundle holds. collect makes the next snapshot look through bundles/ for files no
	// script names (set at start, and after a save failed part way).
	saveMu  sync.Mutex
	onDisk  map[string]bool
	scripts map[*Script]*scriptFile
	refs    map[string]int
	collect bool
	// prev is the desired state the last save wrote (nil before the first), and journal the
	// file saves append to (nil until the first save's snapshot). prevShared: prev is the state
	// the caller saved, not a copy, because it was derived (its maps are never written again).
	// saves numbers the saves, failed ones included, so that a derivation names the save its
	// state came from.
	prev       *Desired
	prevShared bool
	journal    *journal
	saves      uint64
}

// Open validates (or creates) the state directory and its private subdirectories, takes its lock,
// loads or generates the admin token, and reads the runtime's sealing key from outside it.
func Open(dir string, sealingKey SealingKey) (*Store, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	s := &Store{dir: abs, owner: safedir.Current(), onDisk: map[string]bool{}, scripts: map[*Script]*scriptFile{}, collect: true}
	if err := safedir.Ensure(abs, s.owner); err != nil {
		return nil, err
	}
	if err := s.takeLock(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.Close()
		}
	}()
	key, err := s.openSealingKey(sealingKey)
	if err != nil {
		return nil, err
	}
	var previous []byte
	if sealingKey.Previous != "" {
		path, err := filepath.Abs(sealingKey.Previous)
		if err != nil {
			return nil, err
		}
		if err := s.refuseInside(path); err != nil {
			return nil, err
		}
		if previous, err = readSealingKey(path, s.owner); err != nil {
			return nil, fmt.Errorf("previous sealing key: %w", err)
		}
	}
	for _, sub := range []string{secretsDir, socketsDir, bundlesDir} {
		if err := safedir.Ensure(filepath.Join(abs, sub), s.owner); err != nil {
			return nil, err
		}
	}
	// The earlier runtime's incarnation directories held nothing that survives its run.
	if err := safedir.Check(filepath.Join(abs, legacyIncarnationsDir), s.owner); err == nil {
		if err := os.RemoveAll(filepath.Join(abs, legacyIncarnationsDir)); err != nil {
			return nil, fmt.Errorf("remove the earlier runtime's incarnations directory: %w", err)
		}
	}
	// A directory just made (bundles/ on a state directory of an earlier runtime) is in the
	// state directory before any desired.json names a file in it.
	if err := syncDir(abs); err != nil {
		return nil, err
	}
	if s.token, err = s.loadOrCreate(adminapi.TokenFileName, func() ([]byte, error) {
		b, err := randomBytes(32)
		return []byte(hex.EncodeToString(b) + "\n"), err
	}); err != nil {
		return nil, err
	}
	// Separate keys for sealing and for digests, so neither use can be turned against the other.
	s.sealKey = mac(key, []byte("takoform runtime seal v1"))
	s.macKey = mac(key, []byte("takoform runtime digest v1"))
	if previous != nil {
		s.previousSealKey = mac(previous, []byte("takoform runtime seal v1"))
		s.previousMacKey = mac(previous, []byte("takoform runtime digest v1"))
		if s.Resealed, err = s.resealPrevious(); err != nil {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

// resealPrevious seals again under the current key every delivery that opens only under the
// previous one. A delivery that opens under neither is left as it is (OpenSecrets refuses it).
func (s *Store) resealPrevious() (int, error) {
	entries, err := os.ReadDir(filepath.Join(s.dir, secretsDir))
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		f, err := s.readSealed(e.Name())
		if err != nil {
			continue
		}
		if _, err := s.openWith(s.sealKey, f); err == nil {
			continue
		}
		values, err := s.openWith(s.previousSealKey, f)
		if err != nil {
			continue
		}
		if err := s.SealSecrets(f.WorkerUID, f.DeliveryID, values); err != nil {
			return n, fmt.Errorf("seal the delivery of worker %s again under the new key: %w", f.WorkerUID, err)
		}
		n++
	}
	return n, nil
}

func (s *Store) takeLock() error {
	f, err := lockDir(s.dir)
	if err != nil {
		return err
	}
	s.lock = f
	return nil
}

// lockDir takes the lock of the state directory dir, held until the file it returns is closed.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, lockFile)
	if info, err := os.Lstat(path); err == nil && !info.Mode().IsRegular() {
		return nil, &safedir.UnsafePathError{Path: path, Reason: "it is not a regular file"}
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, safedir.FileMode)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("state directory %s is in use by another runtime node (%w)", dir, err)
	}
	return f, nil
}

// Close releases the state directory's lock.
func (s *Store) Close() {
	if s.journal != nil && s.journal.file != nil {
		s.journal.file.Close()
		s.journal.file = nil
	}
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

func (s *Store) loadOrCreate(name string, generate func() ([]byte, error)) (string, error) {
	b, err := safedir.ReadFile(s.dir, name, s.owner)
	if errors.Is(err, fs.ErrNotExist) {
		if b, err = generate(); err != nil {
			return "", err
		}
		if err := safedir.WriteFile(s.dir, name, b, s.owner); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", err
	}
	text := strings.TrimSpace(string(b))
	if text == "" {
		return "", fmt.Errorf("%s is empty", filepath.Join(s.dir, name))
	}
	return text, nil
}

// Dir is the absolute state directory.
func (s *Store) Dir() string { return s.dir }

// Owner is the owner every private path must have.
func (s *Store) Owner() safedir.Owner { return s.owner }

// TokenFile is the path of the admin token file.
func (s *Store) TokenFile() string { return filepath.Join(s.dir, adminapi.TokenFileName) }

// Token is the admin API's bearer token.
func (s *Store) Token() string { return s.token }

// SocketsDir holds the sockets and config of every running org process.
func (s *Store) SocketsDir() string { return filepath.Join(s.dir, socketsDir) }

// Load reads the desired state; a state directory that has none yet holds nothing.
func (s *Store) Load() (*Desired, error) {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	entries, err := os.ReadDir(filepath.Join(s.dir, bundlesDir))
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		// A bundle counts as written only as the node writes it; anything else there is
		// refused if desired.json names it, and is written again (or refused) by a save.
		if validRef(e.Name()) && s.ownFile(filepath.Join(s.dir, bundlesDir), e) {
			s.onDisk[e.Name()] = true
		}
	}
	d := &Desired{Version: desiredVersion}
	b, err := safedir.ReadFile(s.dir, desiredFile, s.owner)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return nil, err
	default:
		var f desiredOnDisk
		if err := json.Unmarshal(b, &f); err != nil {
			return nil, fmt.Errorf("read %s: %w", filepath.Join(s.dir, desiredFile), err)
		}
		if f.Version < 1 || f.Version > desiredVersion {
			return nil, fmt.Errorf("%s has version %d; this runtime reads 1 to %d", filepath.Join(s.dir, desiredFile), f.Version, desiredVersion)
		}
		gen, err := s.replay(&f)
		if err != nil {
			return nil, err
		}
		// The first save writes a snapshot naming the next journal.
		if s.journal != nil && s.journal.file != nil {
			s.journal.file.Close()
		}
		s.journal = &journal{gen: gen, broken: true}
		if d, err = s.readBundles(&f); err != nil {
			return nil, err
		}
	}
	if d.Scripts == nil {
		d.Scripts = map[string]*Script{}
	}
	if d.Routes == nil {
		d.Routes = map[string]*Route{}
	}
	if d.Effects == nil {
		d.Effects = map[string]EffectEntry{}
	}
	return d, nil
}

// Save replaces the desired state atomically: the modules it names not yet in bundles/ first,
// then the state, then it removes the bundles nothing names any more. A save writes what
// changed: the state names modules by digest, a bundle already there is not written again, and
// after the first save of a run, a save appends what changed to the journal (journal.go).
func (s *Store) Save(d *Desired) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	d.Version = desiredVersion
	derived := d.changes != nil
	// A state derived from the last save's names what it changed; any other is compared whole,
	// and against a copy: after a derived save, prev is no copy, so such a state gets a snapshot.
	known := s.prevShared && d.derivedFrom(s.prev, s.saves)
	var err error
	if s.prev == nil || s.journal == nil || s.journal.due() || (!known && s.prevShared) {
		err = s.saveSnapshot(d)
	} else {
		err = s.saveChanges(d, known)
	}
	s.saves++
	if err != nil {
		// What the store knows may be part way: the next save starts again from the whole state.
		s.prev, s.prevShared, s.collect = nil, false, true
		return err
	}
	d.saved, d.changes = s.saves, nil
	if derived {
		s.prev, s.prevShared = d, true
	} else {
		s.prev, s.prevShared = saved(d), false
	}
	return nil
}

// saveSnapshot writes d whole, and then removes from bundles/ what it does not name. Bundles the
// previous state named go only once the new one is surely there: on a crash, whichever of the two
// the disk holds finds its modules. The state is saved either way: what cannot be removed now is
// removed by a later snapshot.
func (s *Store) saveSnapshot(d *Desired) error {
	f, files, refs, err := s.snapshot(d)
	if err != nil {
		return fmt.Errorf("write the bundles: %w", err)
	}
	if err := s.writeSnapshot(f); err != nil {
		return err
	}
	dropped := s.collect
	for ref := range s.refs {
		dropped = dropped || refs[ref] == 0
	}
	s.scripts, s.refs = files, refs
	if dropped {
		s.collect = s.collectBundles(refs) != nil
	}
	return nil
}

// saveChanges appends to the journal what changed since the last save (among the entries d's
// derivation wrote when known, or compared whole), and then removes the bundles no script names
// any more.
func (s *Store) saveChanges(d *Desired, known bool) error {
	w := &bundleWriter{s: s}
	var written changes
	if known {
		written = *d.changes
	}
	changed := entriesChanged(s.prev.Scripts, d.Scripts, written.scripts, !known, equal[*Script])
	files := make(map[string]*scriptFile, len(changed))
	for name, sc := range changed {
		if sc != nil {
			f, err := w.file(*sc)
			if err != nil {
				return fmt.Errorf("write the bundles: %w", err)
			}
			files[name] = f
		}
	}
	if err := w.synced(); err != nil {
		return fmt.Errorf("write the bundles: %w", err)
	}
	if r := record(s.prev, d, &written, !known, changed, files); !r.empty() {
		if err := s.appendRecord(r); err != nil {
			return err
		}
	}
	var released []string
	for name, sc := range changed {
		if old := s.prev.Scripts[name]; old != nil {
			if of := s.scripts[old]; of != nil {
				of.count(s.refs, -1)
				released = append(released, of.modules, of.serving)
			}
			delete(s.scripts, old)
		}
		if sc != nil {
			s.scripts[*sc] = files[name]
			files[name].count(s.refs, 1)
		}
	}
	var freed []string
	for _, ref := range released {
		if n, ok := s.refs[ref]; ok && n <= 0 {
			delete(s.refs, ref)
			freed = append(freed, ref)
		}
	}
	if len(freed) > 0 && s.removeBundles(freed) != nil {
		s.collect = true // the next snapshot looks again
	}
	return nil
}

// MAC is the runtime's keyed digest (hex HMAC-SHA256 under its own key) of msg. It is never a
// reusable digest of a secret: without the key it opens nothing.
func (s *Store) MAC(msg []byte) string { return hex.EncodeToString(mac(s.macKey, msg)) }

// PreviousMAC is MAC under the previous sealing key, while the node has one ("" otherwise).
func (s *Store) PreviousMAC(msg []byte) string {
	if s.previousMacKey == nil {
		return ""
	}
	return hex.EncodeToString(mac(s.previousMacKey, msg))
}

// ValuesMAC is the keyed digest of a delivery's values.
func (s *Store) ValuesMAC(values map[string]vocab.Secret) string {
	return s.MAC(canonjson.Marshal(Reveal(values)))
}

// Reveal returns the plain bindings: for workerd's environment, sealing and the readback HMAC only.
func Reveal(values map[string]vocab.Secret) map[string]string {
	plain := make(map[string]string, len(values))
	for k, v := range values {
		plain[k] = v.Reveal()
	}
	return plain
}

// ValidWorkerUID reports whether uid can name a sealed file (no path separators, no dot-files).
func ValidWorkerUID(uid string) bool { return vocab.OperationID.MatchString(uid) }

type sealedFile struct {
	Format     string `json:"format"`
	WorkerUID  string `json:"workerUid"`
	DeliveryID string `json:"deliveryId"`
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

func sealAAD(workerUID, deliveryID string) []byte {
	return canonjson.Marshal(canonjson.Object{{Key: "format", Value: sealedFileFormat}, {Key: "workerUid", Value: workerUID}, {Key: "deliveryId", Value: deliveryID}})
}

// SealSecrets writes a worker UID's delivery, sealed with AES-256-GCM under the runtime key (fresh
// nonce; the worker UID and delivery id are authenticated), replacing any previous one.
func (s *Store) SealSecrets(workerUID, deliveryID string, values map[string]vocab.Secret) error {
	if !ValidWorkerUID(workerUID) {
		return fmt.Errorf("worker UID %q cannot name a sealed file", workerUID)
	}
	aead, err := aeadOf(s.sealKey)
	if err != nil {
		return err
	}
	nonce, err := randomBytes(aead.NonceSize())
	if err != nil {
		return err
	}
	f := sealedFile{Format: sealedFileFormat, WorkerUID: workerUID, DeliveryID: deliveryID, Nonce: nonce,
		Ciphertext: aead.Seal(nil, nonce, canonjson.Marshal(Reveal(values)), sealAAD(workerUID, deliveryID))}
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	return safedir.WriteFile(filepath.Join(s.dir, secretsDir), workerUID, b, s.owner)
}

// OpenSecrets reads a worker UID's delivery; it fails closed when the file is missing, unsafe,
// corrupt or of another delivery.
func (s *Store) OpenSecrets(workerUID, deliveryID string) (map[string]vocab.Secret, error) {
	if !ValidWorkerUID(workerUID) {
		return nil, fmt.Errorf("worker UID %q cannot name a sealed file", workerUID)
	}
	f, err := s.readSealed(workerUID)
	if err != nil {
		return nil, err
	}
	if f.WorkerUID != workerUID || f.DeliveryID != deliveryID {
		return nil, fmt.Errorf("the sealed file of worker %s holds delivery %s, want %s", workerUID, f.DeliveryID, deliveryID)
	}
	values, err := s.openWith(s.sealKey, f)
	if err != nil && s.previousSealKey != nil {
		values, err = s.openWith(s.previousSealKey, f)
	}
	return values, err
}

// readSealed reads and parses the sealed file of workerUID.
func (s *Store) readSealed(workerUID string) (sealedFile, error) {
	var f sealedFile
	b, err := safedir.ReadFile(filepath.Join(s.dir, secretsDir), workerUID, s.owner)
	if err != nil {
		return f, fmt.Errorf("open the delivery of worker %s: %w", workerUID, err)
	}
	if err := json.Unmarshal(b, &f); err != nil || f.Format != sealedFileFormat || f.WorkerUID != workerUID {
		return f, fmt.Errorf("the delivery of worker %s is not a sealed delivery", workerUID)
	}
	return f, nil
}

// openWith opens f under the seal key key.
func (s *Store) openWith(key []byte, f sealedFile) (map[string]vocab.Secret, error) {
	aead, err := aeadOf(key)
	if err != nil {
		return nil, err
	}
	plain, err := aead.Open(nil, f.Nonce, f.Ciphertext, sealAAD(f.WorkerUID, f.DeliveryID))
	if err != nil {
		return nil, fmt.Errorf("the delivery of worker %s does not open under this runtime's key", f.WorkerUID)
	}
	var m map[string]string
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, fmt.Errorf("the delivery of worker %s is corrupt", f.WorkerUID)
	}
	values := make(map[string]vocab.Secret, len(m))
	for k, v := range m {
		values[k] = vocab.NewSecret(v)
	}
	return values, nil
}

// EraseSecrets removes a worker UID's sealed delivery; an absent one is already erased.
func (s *Store) EraseSecrets(workerUID string) error {
	if !ValidWorkerUID(workerUID) {
		return nil
	}
	err := os.Remove(filepath.Join(s.dir, secretsDir, workerUID))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("erase the delivery of worker %s: %w", workerUID, err)
	}
	return nil
}

// aeadOf is AES-256-GCM under a seal key.
func aeadOf(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}

func mac(key, msg []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(msg)
	return h.Sum(nil)
}

func randomBytes(n int) ([]byte, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return b, nil
}
