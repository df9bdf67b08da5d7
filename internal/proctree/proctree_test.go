package proctree

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

// A child started by this process is below it, and its own child below that.
func TestDescendantsFindsChildrenAndGrandchildren(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sh", "-c", "sleep 30 & wait")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	for range 200 {
		tree, err := Read()
		if err != nil {
			t.Fatal(err)
		}
		below := tree.Descendants(os.Getpid())
		if slices.Contains(below, cmd.Process.Pid) && len(tree[cmd.Process.Pid]) == 1 &&
			slices.Contains(below, tree[cmd.Process.Pid][0]) && below[0] == os.Getpid() {
			return
		}
		exec.Command("sleep", "0.01").Run() //nolint:errcheck // a pause that leaves no goroutine behind
	}
	t.Fatal("the shell and its sleep never showed below this process")
}
