// Package proctree reads the machine's process tree from /proc: which processes each process
// started. The runtime's tests and its density benchmark use it to find an incarnation's sandbox
// and workerd processes below the pid the runtime reports.
package proctree

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Tree maps a pid to the pids of its children.
type Tree map[int][]int

// Read reads the tree as it is now (processes that end while it is read are left out).
func Read() (Tree, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	out := Tree{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after its closing parenthesis.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 {
			ppid, _ := strconv.Atoi(fields[1])
			out[ppid] = append(out[ppid], pid)
		}
	}
	return out, nil
}

// Descendants is pid and every process below it, parents before their children.
func (t Tree) Descendants(pid int) []int {
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, t[out[i]]...)
	}
	return out
}
