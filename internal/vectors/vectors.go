// Package vectors loads the project's shared test vectors for the derived identities. The
// repository keeps a copy under testdata/vectors so that a clone tests on its own; where the
// shared originals sit beside the repository (../shared/vectors), the copy must equal them.
package vectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
)

// root is the repository's root, found from this file's location.
func root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// Load decodes the vector file name (such as "derived-names.json") into out.
func Load(name string, out any) error {
	raw, err := os.ReadFile(filepath.Join(root(), "testdata", "vectors", name))
	if err != nil {
		return fmt.Errorf("vectors: %w", err)
	}
	shared, err := os.ReadFile(filepath.Join(root(), "..", "shared", "vectors", name))
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return fmt.Errorf("vectors: %w", err)
	case !bytes.Equal(raw, shared):
		return fmt.Errorf("vectors: testdata/vectors/%s differs from ../shared/vectors/%s: copy the shared file in", name, name)
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("vectors: %s: %w", name, err)
	}
	return nil
}
