package runtime

import (
	"strings"
	"testing"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// BenchmarkRenderingADesiredIdentity is what a script's identity costs to compute (its bundle
// checked and digested, and its config) by bundle size: the node computes it once per change of
// the desired script, and keeps it for reconciles and status reads. Each round is a new Code (a
// Code keeps its bundle's digest), whose making (a digest of its content) is counted too.
func BenchmarkRenderingADesiredIdentity(b *testing.B) {
	for _, size := range []struct {
		name  string
		bytes int
	}{{"2KiB", 2 << 10}, {"100KiB", 100 << 10}, {"1MiB", 1 << 20}} {
		modules := map[string]string{"index.js": "export default { fetch() { return new Response(\"ok\") } }\n// " + strings.Repeat("padding ", size.bytes/8)}
		read := func(state.Code) (map[string]string, error) { return modules, nil }
		s := &state.Script{Name: "s-bench", MainModule: "index.js", CompatibilityDate: "2025-01-01"}
		b.Run(size.name, func(b *testing.B) {
			b.SetBytes(int64(size.bytes))
			for b.Loop() {
				s.Modules = state.NewCode(modules)
				if _, err := identity(s, read); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
