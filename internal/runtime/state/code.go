package state

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// Code is a script's modules, by name (SPEC 3.6: a node reads code from its own store on
// demand). A put brings the content, which the node holds only until the save that writes it to
// bundles/; from then on, and for every script a start reads, it holds the bundle's name, its
// module names and sizes, and Store.Modules reads the content back when an isolate loads it.
//
// A Code names one content for as long as it lives: only where that content is held changes, so
// a Code is shared by the copies of the desired state like any other value of it. The zero Code
// holds no modules.
type Code struct{ c *code }

type code struct {
	// ref is the bundle's name in bundles/: the SHA-256 of its content as canonical JSON.
	ref   string
	names []string // sorted
	// codeBytes is the size of every module but the source maps.
	codeBytes int64

	mu sync.Mutex
	// raw is the content (the bundle file's), nil once a save has made the file durable.
	raw []byte
	// digests are Digest's answers, by main module.
	digests map[string][32]byte
}

// NewCode is the Code of modules, held in memory until a save writes it.
func NewCode(modules map[string]string) Code {
	if modules == nil {
		return Code{}
	}
	raw := canonjson.Marshal(modules)
	return Code{c: newCode(bundleRef(raw), modules, raw)}
}

func newCode(ref string, modules map[string]string, raw []byte) *code {
	c := &code{ref: ref, names: slices.Sorted(maps.Keys(modules)), raw: raw}
	for name, v := range modules {
		if workerconf.ModuleKind(name) != workerconf.ModuleSourceMap {
			c.codeBytes += int64(len(name) + len(v))
		}
	}
	return c
}

// IsZero reports whether c holds no modules.
func (c Code) IsZero() bool { return c.c == nil }

// Ref is the name of c's bundle in bundles/, the SHA-256 of its content ("" for the zero Code).
func (c Code) Ref() string {
	if c.c == nil {
		return ""
	}
	return c.c.ref
}

// Equal reports whether c and o hold the same modules.
func (c Code) Equal(o Code) bool { return c.Ref() == o.Ref() }

// Names are c's module names, sorted. The caller must not change them.
func (c Code) Names() []string {
	if c.c == nil {
		return nil
	}
	return c.c.names
}

// Has reports whether c has a module of this name.
func (c Code) Has(name string) bool {
	_, ok := slices.BinarySearch(c.Names(), name)
	return ok
}

// CodeBytes is the size of c's modules as an isolate holds them: every module but the source maps
// (a bytes module counted as its base64, a little more than it holds).
func (c Code) CodeBytes() int64 {
	if c.c == nil {
		return 0
	}
	return c.c.codeBytes
}

// Held reports whether c's content is in memory (it is until a save has written it).
func (c Code) Held() bool {
	if c.c == nil {
		return false
	}
	c.c.mu.Lock()
	defer c.c.mu.Unlock()
	return c.c.raw != nil
}

// Digest is compute's answer for c with main module main, kept once it succeeded for as long as c
// lives: what a node derives from a bundle's content (its check and its identity digest) needs no
// read of the store again. A failure is not kept (a read may succeed later).
func (c Code) Digest(main string, compute func() ([32]byte, error)) ([32]byte, error) {
	if c.c == nil {
		return compute()
	}
	c.c.mu.Lock()
	sum, ok := c.c.digests[main]
	c.c.mu.Unlock()
	if ok {
		return sum, nil
	}
	sum, err := compute()
	if err != nil {
		return sum, err
	}
	c.c.mu.Lock()
	if c.c.digests == nil {
		c.c.digests = map[string][32]byte{}
	}
	c.c.digests[main] = sum
	c.c.mu.Unlock()
	return sum, nil
}

// heldRaw is c's content while it is in memory (nil after).
func (c *code) heldRaw() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.raw
}

// release drops c's content from memory: its bundle file is durable.
func (c *code) release() {
	c.mu.Lock()
	c.raw = nil
	c.mu.Unlock()
}

// Modules is c's content: from memory until it is saved, then read from bundles/ and checked
// against its name (a damaged file is refused, never served).
func (s *Store) Modules(c Code) (map[string]string, error) {
	if c.c == nil {
		return nil, nil
	}
	raw := c.c.heldRaw()
	if raw == nil {
		var err error
		if raw, err = s.readBundle(c.c.ref); err != nil {
			return nil, err
		}
	}
	var m map[string]string
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("read the bundle %s: %w", c.c.ref, err)
	}
	return m, nil
}

// Module is one module of c, read as Modules reads them.
func (s *Store) Module(c Code, name string) (string, error) {
	m, err := s.Modules(c)
	if err != nil {
		return "", err
	}
	v, ok := m[name]
	if !ok {
		return "", fmt.Errorf("the bundle %s has no module %q", c.Ref(), name)
	}
	return v, nil
}

// readBundle is the content of bundles/ref, checked against its name.
func (s *Store) readBundle(ref string) ([]byte, error) {
	if !validRef(ref) {
		return nil, fmt.Errorf("a bundle named %q: not a SHA-256", ref)
	}
	dir := filepath.Join(s.dir, bundlesDir)
	b, err := safedir.ReadFile(dir, ref, s.owner)
	if err != nil {
		return nil, fmt.Errorf("read the bundle %s: %w", ref, err)
	}
	if bundleRef(b) != ref {
		return nil, fmt.Errorf("the bundle %s is damaged: its content is not the digest it is named by", filepath.Join(dir, ref))
	}
	return b, nil
}

// loadCode is the Code of the bundle ref, read and checked once as a start reads the state, and
// not held: only its name, module names and sizes stay in memory.
func (s *Store) loadCode(ref string) (Code, error) {
	b, err := s.readBundle(ref)
	if err != nil {
		return Code{}, err
	}
	var m map[string]string
	if err := json.Unmarshal(b, &m); err != nil {
		return Code{}, fmt.Errorf("read the bundle %s: %w", ref, err)
	}
	if m == nil {
		return Code{}, errors.New("the bundle " + ref + " holds no modules")
	}
	return Code{c: newCode(ref, m, nil)}, nil
}
