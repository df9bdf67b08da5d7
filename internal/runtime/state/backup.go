package state

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// BackupFormat names the backup's layout, in its manifest.
const BackupFormat = "takoform.runtime-backup@v1"

// backupManifest is the first entry of a backup.
type backupManifest struct {
	Format         string    `json:"format"`
	CreatedAt      time.Time `json:"createdAt"`
	DesiredVersion int       `json:"desiredVersion"`
	Scripts        int       `json:"scripts"`
	Routes         int       `json:"routes"`
	Deliveries     int       `json:"deliveries"`
}

const manifestName = "backup.json"

// secretName is a file name secrets/ may hold: a worker UID as the Host writes it.
var secretName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Backup writes d, the node's desired state as it stands, to w as a gzipped tar: a manifest,
// desired.json (a snapshot naming no journal), the bundles it names and the sealed delivery of
// each script that has one, sealed as at rest (under the sealing key, which is not in it). The
// admin token, the lock, sockets and the edge's ACME account and certificates are not in it. The
// caller holds the node's lock on d, so no save runs meanwhile.
func (s *Store) Backup(w io.Writer, d *Desired) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	snap, _, refs, err := s.snapshot(d)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	snap.Journal = ""
	desired, err := snap.marshal()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	var sealed []string
	for _, sc := range d.Scripts {
		if sc.Delivery != nil && !slices.Contains(sealed, sc.Delivery.WorkerUID) {
			sealed = append(sealed, sc.Delivery.WorkerUID)
		}
	}
	slices.Sort(sealed)
	gz := gzip.NewWriter(w)
	tw := tar.NewWriter(gz)
	now := time.Now().UTC()
	put := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(b)), ModTime: now, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	manifest, err := json.Marshal(backupManifest{Format: BackupFormat, CreatedAt: now, DesiredVersion: d.Version,
		Scripts: len(d.Scripts), Routes: len(d.Routes), Deliveries: len(sealed)})
	if err != nil {
		return err
	}
	if err := put(manifestName, manifest); err != nil {
		return err
	}
	if err := put(desiredFile, desired); err != nil {
		return err
	}
	for _, ref := range slices.Sorted(maps.Keys(refs)) {
		b, err := safedir.ReadFile(filepath.Join(s.dir, bundlesDir), ref, s.owner)
		if err != nil {
			return fmt.Errorf("backup: bundle %s: %w", ref, err)
		}
		if err := put(bundlesDir+"/"+ref, b); err != nil {
			return err
		}
	}
	// The node's place in its pool (SPEC 6.2): a member of a pool of two or more, restored,
	// serves nothing until the Host confirms it.
	if b, err := safedir.ReadFile(s.dir, MembershipFile, s.owner); err == nil {
		if err := put(MembershipFile, b); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("backup: the node's membership: %w", err)
	}
	for _, uid := range sealed {
		b, err := safedir.ReadFile(filepath.Join(s.dir, secretsDir), uid, s.owner)
		if err != nil {
			return fmt.Errorf("backup: the sealed delivery of %s: %w", uid, err)
		}
		if err := put(secretsDir+"/"+uid, b); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// RestoreOptions are Restore's.
type RestoreOptions struct {
	// Replace: a state directory that holds a desired state already has it replaced (its
	// desired state, journals, bundles and sealed deliveries removed first); without it, such a
	// directory is refused.
	Replace bool
	// MaxBytes bounds what the backup may unpack to (default 16 GiB).
	MaxBytes int64
}

// Restore unpacks a backup Backup wrote into the state directory dir, which no node may be
// running on (its lock is taken meanwhile). dir is created (0700) when absent; an existing one
// must be safe (SPEC 6.3) and keeps its admin token, so that the Hosts' token files stay right. A
// restored node serves what the backup held at once; the Hosts' janitors then put it back to what
// their ledger says (README, "Restores and the node reconciler").
func Restore(r io.Reader, dir string, opts RestoreOptions) (err error) {
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = 16 << 30
	}
	owner := safedir.Current()
	if err := safedir.Ensure(dir, owner); err != nil {
		return err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("restore: %w: stop it first", err)
	}
	defer lock.Close()
	if _, err := os.Lstat(filepath.Join(dir, desiredFile)); err == nil {
		if !opts.Replace {
			return fmt.Errorf("restore: %s already holds a desired state; pass --replace to replace it (its admin token is kept)", dir)
		}
		if err := clearState(dir, owner); err != nil {
			return err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, sub := range []string{bundlesDir, secretsDir} {
		if err := safedir.Ensure(filepath.Join(dir, sub), owner); err != nil {
			return err
		}
	}

	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("restore: not a runtime backup: %w", err)
	}
	tr := tar.NewReader(gz)
	var total int64
	var manifest *backupManifest
	var desired []byte
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		if h.Typeflag != tar.TypeReg {
			return fmt.Errorf("restore: %s is not a regular file; a runtime backup holds only files", h.Name)
		}
		if total += h.Size; total > opts.MaxBytes {
			return fmt.Errorf("restore: the backup unpacks to more than %d bytes", opts.MaxBytes)
		}
		b, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil {
			return fmt.Errorf("restore: %s: %w", h.Name, err)
		}
		switch sub, name, _ := strings.Cut(h.Name, "/"); {
		case h.Name == manifestName:
			manifest = &backupManifest{}
			if err := json.Unmarshal(b, manifest); err != nil || manifest.Format != BackupFormat {
				return fmt.Errorf("restore: not a %s backup", BackupFormat)
			}
		case manifest == nil:
			return fmt.Errorf("restore: the backup does not begin with its manifest (%s)", manifestName)
		case h.Name == desiredFile:
			desired = b
		case h.Name == MembershipFile:
			// Kept as the node held it; a directory's own is replaced only by the backup's.
			if err := safedir.WriteFile(dir, MembershipFile, b, owner); err != nil {
				return err
			}
		case sub == bundlesDir && validRef(name):
			if err := safedir.WriteFile(filepath.Join(dir, bundlesDir), name, b, owner); err != nil {
				return err
			}
		case sub == secretsDir && secretName.MatchString(name):
			if err := safedir.WriteFile(filepath.Join(dir, secretsDir), name, b, owner); err != nil {
				return err
			}
		default:
			return fmt.Errorf("restore: %q is no file of a runtime backup", h.Name)
		}
	}
	if desired == nil {
		return fmt.Errorf("restore: the backup holds no %s", desiredFile)
	}
	var f desiredOnDisk
	if err := json.Unmarshal(desired, &f); err != nil || f.Version < 1 || f.Version > desiredVersion {
		return fmt.Errorf("restore: the backup's desired state is version %d; this runtime reads 1 to %d", f.Version, desiredVersion)
	}
	// Last, so that a restore cut short leaves no desired state naming what is not there.
	if err := safedir.WriteFile(dir, desiredFile, desired, owner); err != nil {
		return err
	}
	return syncDir(dir)
}

// clearState removes a state directory's desired state, journals, bundles and sealed deliveries:
// the node's own files only (regular, 0600, its owner's); anything else is refused, never
// repaired. The admin token stays.
func clearState(dir string, owner safedir.Owner) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		switch name := e.Name(); {
		case name == desiredFile || journalName.MatchString(name):
			if err := safedir.CheckFile(filepath.Join(dir, name), owner); err != nil {
				return err
			}
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return err
			}
		case name == bundlesDir || name == secretsDir:
			sub := filepath.Join(dir, name)
			files, err := os.ReadDir(sub)
			if err != nil {
				return err
			}
			for _, f := range files {
				if err := safedir.CheckFile(filepath.Join(sub, f.Name()), owner); err != nil {
					return err
				}
				if err := os.Remove(filepath.Join(sub, f.Name())); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
