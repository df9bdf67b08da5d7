// Package safedir creates and checks the private directories the Host keeps on disk (SPEC 6.3).
//
// A private directory is created with mode 0700 by its expected owner. An existing path is refused,
// never repaired, when it is a symlink, is not a directory, belongs to another user or group, or has
// another mode. Files inside are written with mode 0600.
package safedir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// DirMode and FileMode are the only modes a private directory and its files may have.
const (
	DirMode  fs.FileMode = 0o700
	FileMode fs.FileMode = 0o600
)

// Owner names the user and group that must own a private path.
type Owner struct {
	UID int
	GID int
}

// Current is the owner of paths this process creates: its effective user and group.
func Current() Owner {
	return Owner{UID: os.Geteuid(), GID: os.Getegid()}
}

// UnsafePathError reports a private path that exists in a form the Host refuses to use.
type UnsafePathError struct {
	Path   string
	Reason string
}

func (e *UnsafePathError) Error() string {
	return fmt.Sprintf("refusing unsafe private path %s: %s (fix or remove it by hand; the Host never repairs an existing path)", e.Path, e.Reason)
}

// Ensure makes path a private directory owned by owner, creating it (and any missing parents, which
// are ordinary 0755 directories) when absent. An existing path must already be safe.
func Ensure(path string, owner Owner) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("create parent of %s: %w", path, err)
	}
	err := os.Mkdir(path, DirMode)
	switch {
	case err == nil:
		// Mkdir honours the umask; set the exact mode, then hand the directory to its owner.
		if err := os.Chmod(path, DirMode); err != nil {
			return fmt.Errorf("set mode of %s: %w", path, err)
		}
		if owner != Current() {
			if err := os.Lchown(path, owner.UID, owner.GID); err != nil {
				return fmt.Errorf("hand %s to uid %d: %w", path, owner.UID, err)
			}
		}
		return Check(path, owner)
	case errors.Is(err, fs.ErrExist):
		return Check(path, owner)
	default:
		return fmt.Errorf("create %s: %w", path, err)
	}
}

// Check refuses path unless it is a real directory owned by owner with mode exactly 0700.
func Check(path string, owner Owner) error {
	info, err := os.Lstat(path)
	if err != nil {
		return fmt.Errorf("inspect %s: %w", path, err)
	}
	if info.Mode()&fs.ModeSymlink != 0 {
		return &UnsafePathError{Path: path, Reason: "it is a symlink"}
	}
	if !info.IsDir() {
		return &UnsafePathError{Path: path, Reason: "it is not a directory"}
	}
	if err := checkOwner(path, info, owner); err != nil {
		return err
	}
	if info.Mode().Perm() != DirMode || info.Mode()&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky) != 0 {
		return &UnsafePathError{Path: path, Reason: fmt.Sprintf("its mode is %#o, want %#o", info.Mode().Perm(), DirMode)}
	}
	return nil
}

// WriteFile writes data to name inside the private directory dir with mode 0600, replacing an
// existing regular file atomically. dir is checked first; an existing target that is not a regular
// file of mode 0600 owned by owner is refused, never repaired.
func WriteFile(dir, name string, data []byte, owner Owner) error {
	if err := Check(dir, owner); err != nil {
		return err
	}
	target := filepath.Join(dir, name)
	if info, err := os.Lstat(target); err == nil {
		if !info.Mode().IsRegular() {
			return &UnsafePathError{Path: target, Reason: "it is not a regular file"}
		}
		if err := checkOwner(target, info, owner); err != nil {
			return err
		}
		if info.Mode().Perm() != FileMode {
			return &UnsafePathError{Path: target, Reason: fmt.Sprintf("its mode is %#o, want %#o", info.Mode().Perm(), FileMode)}
		}
	}
	tmp, err := os.CreateTemp(dir, "."+name+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(FileMode); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", target, err)
	}
	if owner != Current() {
		if err := tmp.Chown(owner.UID, owner.GID); err != nil {
			tmp.Close()
			return fmt.Errorf("write %s: %w", target, err)
		}
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	if err := os.Rename(tmp.Name(), target); err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	return nil
}

// ReadFile reads name from the private directory dir, refusing a file that is not a regular 0600
// file owned by owner.
func ReadFile(dir, name string, owner Owner) ([]byte, error) {
	if err := Check(dir, owner); err != nil {
		return nil, err
	}
	target := filepath.Join(dir, name)
	if err := CheckFile(target, owner); err != nil {
		return nil, err
	}
	return os.ReadFile(target)
}

// CheckFile reports whether path is a private file: a regular file (not a symlink) of mode 0600
// owned by owner. An absent path's error wraps fs.ErrNotExist.
func CheckFile(path string, owner Owner) error {
	info, err := os.Lstat(path)
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return &UnsafePathError{Path: path, Reason: "it is not a regular file"}
	}
	if err := checkOwner(path, info, owner); err != nil {
		return err
	}
	if info.Mode().Perm() != FileMode {
		return &UnsafePathError{Path: path, Reason: fmt.Sprintf("its mode is %#o, want %#o", info.Mode().Perm(), FileMode)}
	}
	return nil
}

func checkOwner(path string, info fs.FileInfo, owner Owner) error {
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok {
		return &UnsafePathError{Path: path, Reason: "its owner cannot be read on this platform"}
	}
	if int(st.Uid) != owner.UID {
		return &UnsafePathError{Path: path, Reason: fmt.Sprintf("it is owned by uid %d, want %d", st.Uid, owner.UID)}
	}
	if int(st.Gid) != owner.GID {
		return &UnsafePathError{Path: path, Reason: fmt.Sprintf("its group is gid %d, want %d", st.Gid, owner.GID)}
	}
	return nil
}
