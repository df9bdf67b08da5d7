package workerconf

import (
	"encoding/base64"
	"fmt"
	"strings"
)

// A module is text (an ES module, .json, .txt) or bytes: .wasm (a WebAssembly module the code
// imports) and .bin (data the code imports as an ArrayBuffer). Bytes travel as standard base64 in
// the API and in the Host's storage; every pack decodes them where it hands them on (SPEC 3.6).

// Module kinds, by name.
const (
	ModuleJS   = "js"
	ModuleJSON = "json"
	ModuleText = "text"
	ModuleWasm = "wasm"
	ModuleData = "data"
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
	}
	return ModuleJS
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

// CheckModules checks that every bytes module's value decodes, and that the main module is code.
func CheckModules(modules map[string]string, main string) error {
	for name, value := range modules {
		if _, err := ModuleBytes(name, value); err != nil {
			return err
		}
	}
	if k := ModuleKind(main); k != ModuleJS {
		return fmt.Errorf("mainModule %q is a %s module; the main module is the worker's ES module code", main, k)
	}
	return nil
}

// BundleBytes is what a bundle holds against an offering's ceiling: its module names and contents,
// bytes modules decoded (one that does not decode counts as its text; CheckModules refuses it).
func BundleBytes(modules map[string]string) int64 {
	var n int64
	for name, value := range modules {
		content, err := ModuleBytes(name, value)
		if err != nil {
			content = []byte(value)
		}
		n += int64(len(name) + len(content))
	}
	return n
}
