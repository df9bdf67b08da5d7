package state

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// A script's modules are kept apart from desired.json, one file per distinct set of modules named
// by the SHA-256 of its content, so that saving the desired state (after every admin change, with
// the node's lock held) writes what changed, not every tenant's code again.

// desiredOnDisk is the desired state as desired.json holds it.
type desiredOnDisk struct {
	Desired
	// Journal names the journal of the saves after this snapshot (version 4).
	Journal string                   `json:"journal,omitempty"`
	Scripts map[string]*scriptOnDisk `json:"scripts"`
}

// desiredToDisk is desiredOnDisk as a save writes it: each script's JSON made once for as long as
// the script is unchanged (a node of thousands of scripts changes one at a time).
type desiredToDisk struct {
	Desired // its Scripts nil
	Journal string
	Scripts map[string]json.RawMessage
}

// marshal is desired.json's content. The scripts' JSON goes in as it is: encoding/json would
// check and compact every byte of it again on every save.
func (f *desiredToDisk) marshal() ([]byte, error) {
	rest, err := json.Marshal(&f.Desired)
	if err != nil {
		return nil, err
	}
	// Version and Scripts are Desired's first two fields, so its JSON begins with them.
	head := fmt.Sprintf(`{"version":%d,"scripts":null`, f.Version)
	if !bytes.HasPrefix(rest, []byte(head)) {
		return nil, fmt.Errorf("the desired state's JSON begins %.40q, not with its version and scripts", rest)
	}
	size := len(rest)
	for name, raw := range f.Scripts {
		size += len(name) + len(raw) + 8
	}
	journal, err := json.Marshal(f.Journal)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, size+len(journal)+16)
	out = fmt.Appendf(out, `{"version":%d,"journal":%s,"scripts":{`, f.Version, journal)
	for i, name := range slices.Sorted(maps.Keys(f.Scripts)) {
		if i > 0 {
			out = append(out, ',')
		}
		key, err := json.Marshal(name)
		if err != nil {
			return nil, err
		}
		out = append(append(append(out, key...), ':'), f.Scripts[name]...)
	}
	out = append(out, '}')
	return append(out, rest[len(head):]...), nil
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

// scriptFile is what a save keeps of one script: the files its modules are in, and its JSON in
// desired.json (nil until a save needs it). It is kept by the script's address from one save to
// the next: the desired state is copied on write and never changes a script or a modules map in
// place, so one *Script is one content for as long as it lives (the cache holds it, so its
// address names no other).
type scriptFile struct {
	raw              json.RawMessage
	modules, serving string // bundle names, "" for none
}

func bundleRef(content []byte) string {
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// bundleWriter writes the bundles one save needs, once each, and syncs bundles/ before the
// state that names them is written. Then the Codes it wrote, or found written, drop their content.
type bundleWriter struct {
	s     *Store
	wrote []string
	seen  []*code
}

// ref is the bundle of c, written unless it is there.
func (w *bundleWriter) ref(c Code) (string, error) {
	if c.c == nil {
		return "", nil
	}
	ref := c.c.ref
	if !w.s.onDisk[ref] && !slices.Contains(w.wrote, ref) {
		raw := c.c.heldRaw()
		if raw == nil {
			// Its content was written and dropped, and the file has gone since: no script
			// of the last save named it. It cannot be written again from here.
			return "", fmt.Errorf("the bundle %s is no longer in %s", ref, filepath.Join(w.s.dir, bundlesDir))
		}
		if err := safedir.WriteFile(filepath.Join(w.s.dir, bundlesDir), ref, raw, w.s.owner); err != nil {
			return "", err
		}
		w.wrote = append(w.wrote, ref)
	}
	w.seen = append(w.seen, c.c)
	return ref, nil
}

// file is sc's scriptFile, its bundles written where they are not yet.
func (w *bundleWriter) file(sc *Script) (*scriptFile, error) {
	f := w.s.scripts[sc]
	if f != nil && f.raw != nil {
		return f, nil
	}
	if f == nil {
		f = &scriptFile{}
		var err error
		if f.modules, err = w.ref(sc.Modules); err != nil {
			return nil, err
		}
		if sc.Serving != nil {
			if f.serving, err = w.ref(sc.Serving.Modules); err != nil {
				return nil, err
			}
		}
	}
	disk := &scriptOnDisk{Script: *sc, ModulesRef: f.modules}
	disk.Script.Serving = nil
	if sc.Serving != nil {
		disk.Serving = &servedOnDisk{Served: *sc.Serving, ModulesRef: f.serving}
	}
	raw, err := json.Marshal(disk)
	if err != nil {
		return nil, err
	}
	return &scriptFile{raw: raw, modules: f.modules, serving: f.serving}, nil
}

// synced makes the bundles written durable in bundles/, before the state naming them is. A file
// counts as there only once this succeeded: a failed save writes it again next time.
func (w *bundleWriter) synced() error {
	if len(w.wrote) > 0 {
		if err := syncDir(filepath.Join(w.s.dir, bundlesDir)); err != nil {
			return err
		}
	}
	for _, ref := range w.wrote {
		w.s.onDisk[ref] = true
	}
	w.wrote = nil
	// Every bundle seen is durable now: the node reads it from bundles/ from here on.
	for _, c := range w.seen {
		c.release()
	}
	w.seen = nil
	return nil
}

// count adds n to the uses of f's bundles in refs.
func (f *scriptFile) count(refs map[string]int, n int) {
	for _, ref := range []string{f.modules, f.serving} {
		if ref != "" {
			refs[ref] += n
		}
	}
}

// snapshot is d in its desired.json form, every script's bundles written, with what the store
// keeps of it once it is saved: each script's file and the uses of each bundle.
func (s *Store) snapshot(d *Desired) (*desiredToDisk, map[*Script]*scriptFile, map[string]int, error) {
	w := &bundleWriter{s: s}
	out := &desiredToDisk{Desired: *d, Scripts: make(map[string]json.RawMessage, len(d.Scripts))}
	out.Desired.Scripts = nil
	files := make(map[*Script]*scriptFile, len(d.Scripts))
	refs := map[string]int{}
	for name, sc := range d.Scripts {
		f, err := w.file(sc)
		if err != nil {
			return nil, nil, nil, err
		}
		files[sc], out.Scripts[name] = f, f.raw
		f.count(refs, 1)
	}
	if err := w.synced(); err != nil {
		return nil, nil, nil, err
	}
	return out, files, refs, nil
}

// collectBundles removes from bundles/ every file the desired state just written (and synced)
// does not name (refs), and any a crash left half-written: the node's own files only (regular,
// 0600, its owner's); anything else there is left for the operator, never repaired.
func (s *Store) collectBundles(refs map[string]int) error {
	dir := filepath.Join(s.dir, bundlesDir)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range entries {
		if refs[e.Name()] > 0 || !s.ownFile(dir, e) {
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

// removeBundles removes the bundles named, which the state just saved no longer names: the
// node's own files only, as collectBundles.
func (s *Store) removeBundles(names []string) error {
	dir := filepath.Join(s.dir, bundlesDir)
	var errs []error
	for _, name := range names {
		path := filepath.Join(dir, name)
		if safedir.CheckFile(path, s.owner) != nil {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		delete(s.onDisk, name)
	}
	return errors.Join(errs...)
}

// readBundles fills in the modules of every script of f (version 2 names them by digest; version
// 1 holds them inline) and returns the desired state. Each bundle is read once and checked, and
// not kept: a file that is missing or whose content is not its name's digest is refused, as the
// node would otherwise serve other code than it was given.
func (s *Store) readBundles(f *desiredOnDisk) (*Desired, error) {
	read := map[string]Code{}
	modules := func(inline map[string]string, ref string) (Code, error) {
		if ref == "" {
			return NewCode(inline), nil
		}
		if c, ok := read[ref]; ok {
			return c, nil
		}
		if !validRef(ref) {
			return Code{}, fmt.Errorf("%s names a bundle %q, which is not a SHA-256", filepath.Join(s.dir, desiredFile), ref)
		}
		c, err := s.loadCode(ref)
		if err != nil {
			return Code{}, fmt.Errorf("%w (named by %s)", err, filepath.Join(s.dir, desiredFile))
		}
		read[ref] = c
		return c, nil
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
