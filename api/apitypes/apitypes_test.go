package apitypes_test

import (
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestGeneratedTypesMatchTheDocument: apitypes.gen.go is exactly what api/openapi.yaml generates
// now, so an edit of the document that was not regenerated (or a hand edit of the generated
// file) fails here as well as in .ci/run's diff after make generate.
func TestGeneratedTypesMatchTheDocument(t *testing.T) {
	out := filepath.Join(t.TempDir(), "apitypes.gen.go")
	cmd := exec.Command("go", "run", "./gen", "-o", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go run ./gen: %v\n%s", err, b)
	}
	want, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile("apitypes.gen.go")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("apitypes.gen.go is not what api/openapi.yaml generates: run make generate (or go generate ./api/...) and commit the result")
	}
}

// TestTheWireTypesAreALeaf: the generated types import the standard library at most, so the
// Host's domain packages, the server and the provider's client can all use them.
func TestTheWireTypesAreALeaf(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		parsed, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range parsed.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: the wire types import the standard library only", f, path)
			}
		}
	}
}
