package sandbox

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeCPUHierarchy is a v1 cpu hierarchy in a plain directory, with organization 200000's
// directory in it: the files the runtime writes are files there. It has cpu.idle when idle is
// true.
func fakeCPUHierarchy(t *testing.T, idle bool) (*cgroups, string) {
	t.Helper()
	base := filepath.Join(t.TempDir(), "takoform-test")
	require.NoError(t, os.Mkdir(base, 0o755))
	if idle {
		require.NoError(t, os.WriteFile(filepath.Join(base, "cpu.idle"), []byte("0\n"), 0o644))
	}
	c := &cgroups{
		hierarchies: []hierarchy{{controllers: []string{ctlCPU}, dir: filepath.Dir(base), base: base}},
		limits:      Limits{CPUWeight: DefaultCPUWeight},
	}
	// The kernel makes a cgroup's files with it: here they are made beforehand.
	org := filepath.Join(base, orgName(200000))
	require.NoError(t, os.Mkdir(org, 0o755))
	files := []string{"cpu.shares"}
	if idle {
		files = append(files, "cpu.idle")
	}
	for _, name := range files {
		require.NoError(t, os.WriteFile(filepath.Join(org, name), nil, 0o644))
	}
	return c, org
}

func readOrgCPU(t *testing.T, org string) string {
	t.Helper()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(org, name))
		if os.IsNotExist(err) {
			return "-"
		}
		require.NoError(t, err)
		return strings.TrimSpace(string(b))
	}
	return "shares=" + read("cpu.shares") + " idle=" + read("cpu.idle")
}

// An organization yields the CPU while any process of it does, and is of the idle class only
// while a worker holds every process of it: a quarantined loop beside a process that answers
// leaves its organization at the least weight, never idle.
func TestAnOrganizationIsIdleOnlyWhileEveryProcessOfItIsHeld(t *testing.T) {
	t.Parallel()
	c, org := fakeCPUHierarchy(t, true)
	shared, err := c.create(200000, "proc-shared", 0, false)
	require.NoError(t, err)
	require.Equal(t, "shares=1024 idle=0", readOrgCPU(t, org))

	// The shared process held, alone: the least weight, and the idle class.
	require.NoError(t, shared.setStalled(true))
	require.NoError(t, shared.setHeld(true))
	require.Equal(t, "shares=10 idle=1", readOrgCPU(t, org))

	// A quarantine process starts at the least weight (its organization a suspect) and is not
	// held: the organization leaves the idle class before the program runs.
	alone, err := c.create(200000, "proc-alone", 0, true)
	require.NoError(t, err)
	require.Equal(t, "shares=10 idle=0", readOrgCPU(t, org))

	// The quarantined loop held, the shared process answering: never idle.
	require.NoError(t, shared.setHeld(false))
	require.NoError(t, shared.setStalled(false))
	require.NoError(t, alone.setHeld(true))
	require.Equal(t, "shares=10 idle=0", readOrgCPU(t, org))

	// Both held: idle; one answers again: out of the class, still at the least weight.
	require.NoError(t, shared.setStalled(true))
	require.NoError(t, shared.setHeld(true))
	require.Equal(t, "shares=10 idle=1", readOrgCPU(t, org))
	require.NoError(t, shared.setHeld(false))
	require.Equal(t, "shares=10 idle=0", readOrgCPU(t, org))
}

// The kernel refuses a weight written to an idle group: into the idle class the weight is written
// first, out of it last.
func TestTheIdleClassIsEnteredAfterTheWeightAndLeftBeforeIt(t *testing.T) {
	t.Parallel()
	h := hierarchy{controllers: []string{ctlCPU}}
	h.base = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(h.base, "cpu.idle"), []byte("0\n"), 0o644))
	require.Equal(t, [][2]string{{"cpu.shares", "10"}, {"cpu.idle", "1"}}, cpuFiles(h, cpuState{weight: StalledCPUWeight, idle: true}))
	require.Equal(t, [][2]string{{"cpu.idle", "0"}, {"cpu.shares", "1024"}}, cpuFiles(h, cpuState{weight: DefaultCPUWeight}))

	// Without cpu.idle, only the weight.
	require.NoError(t, os.Remove(filepath.Join(h.base, "cpu.idle")))
	require.Equal(t, [][2]string{{"cpu.shares", "10"}}, cpuFiles(h, cpuState{weight: StalledCPUWeight, idle: true}))
}
