// Package workerdtest finds the real workerd for tests. Tests never mock it: without it they skip
// with a message saying how to install it, except under CI=true, where a missing workerd fails.
package workerdtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// Binary returns the path of workerd: $TAKOFORM_WORKERD, else .tools/bin/workerd of the enclosing
// repository (tests run in their package's directory), else workerd on PATH.
func Binary(tb testing.TB) string {
	tb.Helper()
	explicit := ""
	if dir, err := os.Getwd(); err == nil && os.Getenv(workerd.EnvVar) == "" {
		for ; ; dir = filepath.Dir(dir) {
			candidate := filepath.Join(dir, ".tools", "bin", "workerd")
			if _, err := os.Stat(candidate); err == nil {
				explicit = candidate
				break
			}
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil || dir == filepath.Dir(dir) {
				break
			}
		}
	}
	path, err := workerd.Find(explicit)
	if err != nil {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("CI=true needs the real workerd: %v", err)
		}
		tb.Skipf("these tests run the real workerd, which is not installed: %v", err)
	}
	return path
}
