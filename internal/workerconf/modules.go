package workerconf

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
)

// A module is text (an ES module, .json, .txt) or bytes: .wasm (a WebAssembly module the code
// imports) and .bin (data the code imports as an ArrayBuffer). Bytes travel as standard base64 in
// the API and in the Host's storage; every pack decodes them where it hands them on (SPEC 3.6).
// A code module may have a source map beside it, `<module>.map`: kept with the bundle, never
// loaded into the isolate, read only to name original places in the worker's log.

// Module kinds, by name.
const (
	ModuleJS   = "js"
	ModuleJSON = "json"
	ModuleText = "text"
	ModuleWasm = "wasm"
	ModuleData = "data"
	// ModuleSourceMap is a code module's source map: not a module the worker can import.
	ModuleSourceMap = "sourcemap"
)

// MaxSourceMapBytes bounds one source map, and MaxSourceMapsBytes all of a bundle's together
// (they are not counted against the offering's maxBundleBytes).
const (
	MaxSourceMapBytes  = 2 << 20
	MaxSourceMapsBytes = 4 << 20
)

// ModuleKind is the kind of the module named name, by its extension.
func ModuleKind(name string) string {
	switch {
	case strings.HasSuffix(name, ".json"):
		return ModuleJSON
	case strings.HasSuffix(name, ".txt"):
		return ModuleText
	case strings.HasSuffix(name, ".wasm"):
		return ModuleWasm
	case strings.HasSuffix(name, ".bin"):
		return ModuleData
	case strings.HasSuffix(name, ".map"):
		return ModuleSourceMap
	}
	return ModuleJS
}

// SourceMapOf is the module a source map named name maps ("index.js" for "index.js.map"), and
// whether name is a source map's.
func SourceMapOf(name string) (string, bool) {
	if ModuleKind(name) != ModuleSourceMap {
		return "", false
	}
	return strings.TrimSuffix(name, ".map"), true
}

// BytesModule reports whether the module named name holds bytes (base64 on the wire).
func BytesModule(name string) bool {
	k := ModuleKind(name)
	return k == ModuleWasm || k == ModuleData
}

// ModuleBytes is the content of a module as bytes: a bytes module's base64 decoded, a text
// module's text.
func ModuleBytes(name, value string) ([]byte, error) {
	if !BytesModule(name) {
		return []byte(value), nil
	}
	b, err := base64.StdEncoding.DecodeString(value)
	if err != nil {
		return nil, fmt.Errorf("module %q holds bytes (%s): its value must be standard base64 (filebase64() gives it): %v", name, ModuleKind(name), err)
	}
	return b, nil
}

// CheckModules checks that every bytes module's value decodes, that every source map is one
// (version 3, within its bounds) beside the code module it names, and that the main module is
// code.
func CheckModules(modules map[string]string, main string) error {
	var maps int64
	for name, value := range modules {
		if _, err := ModuleBytes(name, value); err != nil {
			return err
		}
		if _, ok := SourceMapOf(name); ok {
			if err := CheckSourceMap(modules, name); err != nil {
				return err
			}
			maps += int64(len(value))
		}
	}
	if maps > MaxSourceMapsBytes {
		return fmt.Errorf("the source maps hold %d bytes together; a bundle's maps may hold at most %d", maps, MaxSourceMapsBytes)
	}
	if k := ModuleKind(main); k != ModuleJS {
		return fmt.Errorf("mainModule %q is a %s module; the main module is the worker's ES module code", main, k)
	}
	return nil
}

// CheckSourceMap checks the source map name of a bundle: beside an ES module of the bundle, at
// most MaxSourceMapBytes, and a version 3 map (its mappings are read when they are used).
func CheckSourceMap(modules map[string]string, name string) error {
	value := modules[name]
	mapped, _ := SourceMapOf(name)
	if _, ok := modules[mapped]; !ok || ModuleKind(mapped) != ModuleJS {
		return fmt.Errorf("module %q is a source map, but the bundle has no ES module %q beside it for it to map", name, mapped)
	}
	if len(value) > MaxSourceMapBytes {
		return fmt.Errorf("source map %q holds %d bytes; a source map may hold at most %d", name, len(value), MaxSourceMapBytes)
	}
	var m struct {
		Version  int             `json:"version"`
		Sources  []string        `json:"sources"`
		Mappings *string         `json:"mappings"`
		Sections json.RawMessage `json:"sections"`
	}
	if err := json.Unmarshal([]byte(value), &m); err != nil {
		return fmt.Errorf("source map %q is not JSON: %v", name, err)
	}
	if m.Version != 3 || (m.Mappings == nil && m.Sections == nil) {
		return fmt.Errorf("source map %q is not a version 3 source map (it needs \"version\": 3 and \"mappings\")", name)
	}
	return nil
}

// ModuleDigest is a module's content digest: hex SHA-256 of its bytes (a bytes module's decoded,
// a text module's text), what filesha256() gives for the module's file.
func ModuleDigest(name, value string) string {
	content, err := ModuleBytes(name, value)
	if err != nil {
		content = []byte(value) // refused at validation; a digest is still a digest
	}
	sum := sha256.Sum256(content)
	return hex.EncodeToString(sum[:])
}

// WireBytes is a bundle's module names and values together, as they travel (a bytes module's
// base64): what the provider's bundle_bytes shows.
func WireBytes(modules map[string]string) int64 {
	var n int64
	for name, value := range modules {
		n += int64(len(name) + len(value))
	}
	return n
}

// HasSourceMaps reports whether a bundle carries a source map.
func HasSourceMaps(modules map[string]string) bool {
	for name := range modules {
		if _, ok := SourceMapOf(name); ok {
			return true
		}
	}
	return false
}

// BundleBytes is what a bundle holds against an offering's ceiling: its module names and contents,
// bytes modules decoded (one that does not decode counts as its text; CheckModules refuses it),
// source maps left out.
func BundleBytes(modules map[string]string) int64 {
	var n int64
	for name, value := range modules {
		if _, ok := SourceMapOf(name); ok {
			continue
		}
		content, err := ModuleBytes(name, value)
		if err != nil {
			content = []byte(value)
		}
		n += int64(len(name) + len(content))
	}
	return n
}
