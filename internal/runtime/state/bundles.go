package state

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"unsafe"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// A script's modules are kept apart from desired.json, one file per distinct set of modules named
// by the SHA-256 of its content, so that saving the desired state (after every admin change, with
// the node's lock held) writes what changed, not every tenant's code again.

// desiredOnDisk is the desired state as desired.json holds it.
type desiredOnDisk struct {
	Desired
	Scripts map[string]*scriptOnDisk `json:"scripts"`
}

// scriptOnDisk is a Script as desired.json holds it: its modules by the digest of their file in
// bundles/ (version 2), or inline (version 1, read only).
type scriptOnDisk struct {
	Script
	Modules    map[string]string `json:"modules,omitempty"`
	ModulesRef string            `json:"modulesRef,omitempty"`
	Serving    *servedOnDisk     `json:"serving,omitempty"`
}

// servedOnDisk is a Served as desired.json holds it, its modules as a Script's.
type servedOnDisk struct {
	Served
	Modules    map[string]string `json:"modules,omitempty"`
	ModulesRef string            `json:"modulesRef,omitempty"`
}

// bundleFile is one set of modules and the name of its file.
type bundleFile struct {
	modules map[string]string // kept, so that its address names no other map while cached
	ref     string
}

// mapKey is a modules map's identity. The desired state is copied on write and never changes a
// modules map in place, so one map is one content for as long as it lives.
func mapKey(m map[string]string) unsafe.Pointer { return reflect.ValueOf(m).UnsafePointer() }

func bundleRef(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// writeBundles puts the modules of every script of d in bundles/ (those not there yet) and
// returns d in its on-disk form. The caller writes desired.json next, then collects.
func (s *Store) writeBundles(d *Desired) (*desiredOnDisk, map[string]bool, error) {
	dir := filepath.Join(s.dir, bundlesDir)
	used := map[string]bool{}
	cache := make(map[unsafe.Pointer]bundleFile, len(d.Scripts))
	var wrote []string // written, not yet synced into the directory
	ref := func(m map[string]string) (string, error) {
		if m == nil {
			return "", nil
		}
		k := mapKey(m)
		b, ok := cache[k]
		if !ok {
			if b, ok = s.bundles[k]; !ok {
				content := canonjson.Marshal(m)
				b = bundleFile{modules: m, ref: bundleRef(content)}
				if !s.onDisk[b.ref] && !slices.Contains(wrote, b.ref) {
					if err := safedir.WriteFile(dir, b.ref, content, s.owner); err != nil {
						return "", err
					}
					wrote = append(wrote, b.ref)
				}
			}
			cache[k] = b
		}
		used[b.ref] = true
		return b.ref, nil
	}
	out := &desiredOnDisk{Desired: *d, Scripts: make(map[string]*scriptOnDisk, len(d.Scripts))}
	out.Desired.Scripts = nil
	for name, sc := range d.Scripts {
		f := &scriptOnDisk{Script: *sc}
		f.Script.Modules, f.Script.Serving = nil, nil
		var err error
		if f.ModulesRef, err = ref(sc.Modules); err != nil {
			return nil, nil, err
		}
		if sc.Serving != nil {
			f.Serving = &servedOnDisk{Served: *sc.Serving}
			f.Serving.Served.Modules = nil
			if f.Serving.ModulesRef, err = ref(sc.Serving.Modules); err != nil {
				return nil, nil, err
			}
		}
		out.Scripts[name] = f
	}
	if len(wrote) > 0 {
		// The files desired.json is about to name are on disk before it is. A file counts as
		// there only once this succeeded: a failed save writes it again next time.
		if err := syncDir(dir); err != nil {
			return nil, nil, err
		}
		for _, ref := range wrote {
			s.onDisk[ref] = true
		}
	}
	s.bundles = cache
	return out, used, nil
}

// collectBundles removes from bundles/ every file the desired state just written (and synced)
// does not name, and any a crash left half-written: the node's own files only (regular, 0600,
// its owner's); anything else there is left for the operator, never repaired.
func (s *Store) collectBundles(used map[string]bool) error {
	dir := filepath.Join(s.dir, bundlesDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if used[e.Name()] || !s.ownFile(dir, e) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(s.onDisk, e.Name())
	}
	return errors.Join(errs...)
}

// readBundles fills in the modules of every script of f (version 2 names them by digest) and
// returns the desired state. A file that is missing or whose content is not its name's digest is
// refused: the node would otherwise serve other code than it was given.
func (s *Store) readBundles(f *desiredOnDisk) (*Desired, error) {
	dir := filepath.Join(s.dir, bundlesDir)
	read := map[string]map[string]string{}
	modules := func(inline map[string]string, ref string) (map[string]string, error) {
		if ref == "" {
			return inline, nil
		}
		if m, ok := read[ref]; ok {
			return m, nil
		}
		if !validRef(ref) {
			return nil, fmt.Errorf("%s names a bundle %q, which is not a SHA-256", filepath.Join(s.dir, desiredFile), ref)
		}
		b, err := safedir.ReadFile(dir, ref, s.owner)
		if err != nil {
			return nil, fmt.Errorf("read the bundle %s named by %s: %w", ref, filepath.Join(s.dir, desiredFile), err)
		}
		if bundleRef(b) != ref {
			return nil, fmt.Errorf("the bundle %s is damaged: its content is not the digest it is named by", filepath.Join(dir, ref))
		}
		var m map[string]string
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("read the bundle %s: %w", filepath.Join(dir, ref), err)
		}
		read[ref] = m
		s.bundles[mapKey(m)] = bundleFile{modules: m, ref: ref}
		return m, nil
	}
	d := f.Desired
	d.Scripts = make(map[string]*Script, len(f.Scripts))
	for name, sf := range f.Scripts {
		sc := sf.Script
		var err error
		if sc.Modules, err = modules(sf.Modules, sf.ModulesRef); err != nil {
			return nil, err
		}
		if sf.Serving != nil {
			sv := sf.Serving.Served
			if sv.Modules, err = modules(sf.Serving.Modules, sf.Serving.ModulesRef); err != nil {
				return nil, err
			}
			sc.Serving = &sv
		}
		d.Scripts[name] = &sc
	}
	return &d, nil
}

// ownFile reports whether e is a file of the node's own in dir: regular, mode 0600, its owner's.
func (s *Store) ownFile(dir string, e fs.DirEntry) bool {
	if !e.Type().IsRegular() {
		return false
	}
	return safedir.CheckFile(filepath.Join(dir, e.Name()), s.owner) == nil
}

// validRef reports whether ref can name a bundle file: a lowercase hex SHA-256.
func validRef(ref string) bool {
	if len(ref) != sha256.Size*2 {
		return false
	}
	_, err := hex.DecodeString(ref)
	return err == nil && strings.ToLower(ref) == ref
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
