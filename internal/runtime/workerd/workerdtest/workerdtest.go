// Package workerdtest finds the real workerd for tests. Tests never mock it: without it they skip
// with a message saying how to install it, except under CI=true, where a missing workerd fails.
package workerdtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

// SubtreeCPU is the CPU time (user and system, every thread) process pid and every process below
// it have used: a sandboxed workerd's pid is its bwrap's, whose child runs workerd. 0 for pid 0,
// or for a process gone.
func SubtreeCPU(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	var total time.Duration
	// The command name may hold spaces; the fields after it are fixed (proc(5)).
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	if len(fields) > 12 {
		utime, _ := strconv.ParseInt(fields[11], 10, 64)
		stime, _ := strconv.ParseInt(fields[12], 10, 64)
		total += time.Duration(utime+stime) * time.Second / ClockTicks
	}
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	for _, child := range strings.Fields(string(children)) {
		n, _ := strconv.Atoi(child)
		total += SubtreeCPU(n)
	}
	return total
}

// ClockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every Linux architecture Go
// supports.
const ClockTicks = 100
