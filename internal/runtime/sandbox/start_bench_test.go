package sandbox

import (
	"io"
	"os/exec"
	"testing"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

// BenchmarkStartWorkerdVersion is what the sandbox adds to each start: workerd --version run
// directly, against the same run through the sandbox with its cgroups (go test -run '^$' -bench .).
func BenchmarkStartWorkerdVersion(b *testing.B) {
	bin := workerdtest.Binary(b)
	b.Run("direct", func(b *testing.B) {
		for b.Loop() {
			if err := exec.Command(bin, "--version").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("sandboxed", func(b *testing.B) {
		s, err := New(Config{Node: "takoform-bench-start"})
		if err != nil {
			b.Skipf("this machine cannot sandbox: %v", err)
		}
		defer s.Close()
		for b.Loop() {
			p, err := s.Start(Program{Path: bin, Args: []string{"--version"}, UID: DefaultUIDRange.First + 990, Name: "inc-bench", Stdout: io.Discard})
			if err != nil {
				b.Fatal(err)
			}
			if err := p.Wait(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
