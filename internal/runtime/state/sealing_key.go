package state

import (
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// LegacyKeyFile is where runtimes before SPEC 5.1 kept their sealing key: inside the state
// directory, beside the sealed deliveries it opens. Open refuses a state directory that still holds
// it.
const LegacyKeyFile = "runtime-key"

// SealingKey says where the runtime's own sealing key lives: a file outside the state directory
// (SPEC 5.1), so that a copy of the state directory (a backup, a snapshot, a worker that escaped
// into it) holds sealed deliveries but never the key that opens them.
type SealingKey struct {
	// File is the key file: 32 random bytes as one line of standard base64, mode 0600.
	File string
	// CreateIfAbsent is the dev path (`takoserver dev`): a missing File is created, or adopted from
	// LegacyKeyFile of the state directory by moving it there once.
	CreateIfAbsent bool
	// Previous, when set, is the key File replaces (a rotation): deliveries sealed under it are
	// sealed again under File when the store opens, and opened under it until then. Once the
	// node has started with both, Previous may be dropped.
	Previous string
}

// LegacyKeyError reports a sealing key found inside the state directory.
type LegacyKeyError struct {
	Found string // the key file inside the state directory
	Want  string // the --sealing-key-file path, if one was given
}

func (e *LegacyKeyError) Error() string {
	want := e.Want
	if want == "" {
		want = "/a/private/directory/runtime-sealing-key"
	}
	return fmt.Sprintf("the runtime's sealing key is inside its state directory (%s), beside the deliveries it opens; "+
		"move it out once and name it with --sealing-key-file: mv %s %s (keep it 0600, outside the state directory, "+
		"and delete any backup of the state directory that holds it)", e.Found, e.Found, want)
}

// WriteSealingKeyFile writes a fresh sealing key to path, mode 0600. It never overwrites anything:
// the key is the only thing that opens the deliveries sealed under it.
func WriteSealingKeyFile(path string) error {
	key, err := randomBytes(32)
	if err != nil {
		return err
	}
	return writeNew(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"))
}

// writeNew creates path with data, complete or not at all, and refuses an existing path: it writes
// a temporary file beside it and hard-links it into place (link never replaces).
func writeNew(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write sealing key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(safedir.FileMode); err != nil {
		tmp.Close()
		return fmt.Errorf("write sealing key file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write sealing key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write sealing key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write sealing key file: %w", err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("%s already exists; a sealing key file is never overwritten", path)
		}
		return fmt.Errorf("write sealing key file: %w", err)
	}
	return nil
}

// openSealingKey finds, checks and reads the sealing key of the store (whose directory is already
// checked and locked).
func (s *Store) openSealingKey(k SealingKey) ([]byte, error) {
	legacy := filepath.Join(s.dir, LegacyKeyFile)
	if k.File == "" {
		if _, err := os.Lstat(legacy); err == nil {
			return nil, &LegacyKeyError{Found: legacy}
		}
		return nil, errors.New("no sealing key: pass --sealing-key-file with a key file outside the state directory " +
			"(create one with `takoserver runtime init-sealing-key --out FILE`)")
	}
	path, err := filepath.Abs(k.File)
	if err != nil {
		return nil, err
	}
	if err := s.refuseInside(path); err != nil {
		return nil, err
	}
	legacyInfo, legacyErr := os.Lstat(legacy)
	keyInfo, keyErr := os.Lstat(path)
	switch {
	case legacyErr == nil && k.CreateIfAbsent && keyErr == nil && os.SameFile(legacyInfo, keyInfo):
		// A move interrupted between its link and its remove: finish it.
		if err := os.Remove(legacy); err != nil {
			return nil, fmt.Errorf("move the sealing key %s to %s: %w", legacy, path, err)
		}
	case legacyErr == nil && k.CreateIfAbsent && errors.Is(keyErr, fs.ErrNotExist):
		// The dev path moves a key an earlier version left in the state directory, once: a dev
		// node's deliveries stay readable across the upgrade.
		if err := s.privateParent(path); err != nil {
			return nil, err
		}
		if err := os.Link(legacy, path); err != nil {
			return nil, fmt.Errorf("move the sealing key %s to %s: %w", legacy, path, err)
		}
		if err := os.Remove(legacy); err != nil {
			return nil, fmt.Errorf("move the sealing key %s to %s: %w", legacy, path, err)
		}
		s.movedKey = legacy
	case legacyErr == nil:
		return nil, &LegacyKeyError{Found: legacy, Want: path}
	case k.CreateIfAbsent && errors.Is(keyErr, fs.ErrNotExist):
		if err := s.privateParent(path); err != nil {
			return nil, err
		}
		if err := WriteSealingKeyFile(path); err != nil {
			return nil, err
		}
	}
	return readSealingKey(path, s.owner)
}

// privateParent makes sure the directory a key file is created in is private: created 0700 when
// absent; an existing one must be a real directory nobody but its owner can enter. Its owner may
// be another user (as root, `takoserver dev` keeps its keys in the PostgreSQL cluster's directory,
// owned by the cluster's user): the key file itself must be the runtime's and 0600, so whoever
// owns the directory can delete the key (deliveries then fail closed) but never read or replace it.
func (s *Store) privateParent(path string) error {
	dir := filepath.Dir(path)
	info, err := os.Lstat(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return safedir.Ensure(dir, s.owner)
	}
	if err != nil {
		return err
	}
	if !info.IsDir() {
		return &safedir.UnsafePathError{Path: dir, Reason: "it is not a directory"}
	}
	if info.Mode().Perm()&0o077 != 0 {
		return &safedir.UnsafePathError{Path: dir, Reason: fmt.Sprintf("its mode is %#o; a sealing key is only created in a directory of mode 0700", info.Mode().Perm())}
	}
	return nil
}

// MovedLegacyKey names the key file the dev path moved out of the state directory at Open, if any.
func (s *Store) MovedLegacyKey() string { return s.movedKey }

// refuseInside refuses a key path within the state directory, symlinks resolved on both sides
// (through the deepest part of path that exists).
func (s *Store) refuseInside(path string) error {
	dir, err := filepath.EvalSymlinks(s.dir)
	if err != nil {
		return err
	}
	resolved, rest := path, ""
	for {
		real, err := filepath.EvalSymlinks(resolved)
		if err == nil {
			resolved = filepath.Join(real, rest)
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || filepath.Dir(resolved) == resolved {
			return err
		}
		rest = filepath.Join(filepath.Base(resolved), rest)
		resolved = filepath.Dir(resolved)
	}
	rel, err := filepath.Rel(dir, resolved)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return nil
	}
	return fmt.Errorf("the sealing key file %s is inside the state directory %s: keep it outside, away from the deliveries it opens", path, s.dir)
}

// readSealingKey reads a key file that must be a regular file of the runtime's user, readable by
// it alone, holding 32 bytes of standard base64.
func readSealingKey(path string, owner safedir.Owner) ([]byte, error) {
	info, err := os.Lstat(path)
	if err != nil {
		return nil, fmt.Errorf("sealing key file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return nil, &safedir.UnsafePathError{Path: path, Reason: "it is not a regular file"}
	}
	if st, ok := info.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != owner.UID {
		return nil, &safedir.UnsafePathError{Path: path, Reason: "it is not owned by the runtime's user"}
	}
	if info.Mode().Perm()&0o077 != 0 {
		return nil, &safedir.UnsafePathError{Path: path, Reason: fmt.Sprintf("its mode is %#o; it must be readable by its owner only (0600)", info.Mode().Perm())}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sealing key file: %w", err)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(string(raw)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("sealing key file %s must hold 32 bytes as one line of standard base64", path)
	}
	return key, nil
}
