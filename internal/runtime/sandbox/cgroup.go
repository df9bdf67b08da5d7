package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The controllers the sandbox sets a ceiling with (SPEC 5.1).
const (
	ctlMemory = "memory"
	ctlCPU    = "cpu"
	ctlPids   = "pids"
)

var neededControllers = []string{ctlMemory, ctlCPU, ctlPids}

// hierarchy is one cgroup hierarchy the runtime places incarnations in: a v1 hierarchy serving
// some of the controllers it needs, or the v2 (unified) hierarchy.
type hierarchy struct {
	v2 bool
	// controllers are the needed controllers this hierarchy serves for the sandbox.
	controllers []string
	// dir is the runtime's own cgroup in it (from /proc/self/cgroup, under its mount point).
	dir string
	// base is this node's cgroup under dir, where organizations' cgroups are made.
	base string
}

func (h hierarchy) serves(ctl string) bool { return slices.Contains(h.controllers, ctl) }

func (h hierarchy) String() string {
	v := "v1"
	if h.v2 {
		v = "v2"
	}
	return fmt.Sprintf("%s %s (%s)", v, h.dir, strings.Join(h.controllers, ","))
}

// cgroupLine is one line of /proc/self/cgroup.
type cgroupLine struct {
	v2          bool
	controllers []string
	path        string
}

// cgroupMount is one cgroup or cgroup2 mount of /proc/self/mountinfo.
type cgroupMount struct {
	v2          bool
	controllers []string // v1: the controllers among its super options
	root        string   // the hierarchy path mounted there
	point       string
}

func parseProcCgroup(b []byte) []cgroupLine {
	var out []cgroupLine
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		l := cgroupLine{path: parts[2]}
		if parts[0] == "0" && parts[1] == "" {
			l.v2 = true
		} else {
			l.controllers = strings.Split(parts[1], ",")
		}
		out = append(out, l)
	}
	return out
}

func parseMountinfo(b []byte) []cgroupMount {
	var out []cgroupMount
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 3 {
			continue
		}
		m := cgroupMount{root: unescapeMount(f[3]), point: unescapeMount(f[4])}
		switch g[0] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			m.controllers = strings.Split(g[2], ",")
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

// unescapeMount undoes mountinfo's octal escapes (\040 is a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups pairs each line of /proc/self/cgroup with a mount of its hierarchy and answers the
// runtime's own cgroup directory there. Named v1 hierarchies (name=systemd) and hierarchies
// serving none of the needed controllers are left out; the v2 hierarchy is kept whatever it
// serves, as the place every incarnation is also put.
func ownCgroups(procCgroup, mountinfo []byte) []hierarchy {
	mounts := parseMountinfo(mountinfo)
	var out []hierarchy
	for _, l := range parseProcCgroup(procCgroup) {
		path := strings.TrimSuffix(l.path, " (deleted)")
		var needed []string
		if !l.v2 {
			for _, c := range l.controllers {
				if slices.Contains(neededControllers, c) {
					needed = append(needed, c)
				}
			}
			if len(needed) == 0 {
				continue
			}
		}
		for _, m := range mounts {
			if m.v2 != l.v2 || (!l.v2 && !containsAll(m.controllers, l.controllers)) {
				continue
			}
			rel, ok := underRoot(path, m.root)
			if !ok {
				continue
			}
			out = append(out, hierarchy{v2: l.v2, controllers: needed, dir: filepath.Join(m.point, rel)})
			break
		}
	}
	return out
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}

// underRoot answers path relative to a mount's root, when the mount shows it.
func underRoot(path, root string) (string, bool) {
	if root == "/" {
		return path, true
	}
	if path == root {
		return "/", true
	}
	if strings.HasPrefix(path, root+"/") {
		return strings.TrimPrefix(path, root), true
	}
	return "", false
}

// cgroups creates and removes the per-incarnation cgroups under the runtime's own cgroup in each
// hierarchy: org-<uid>/inc-<name>.
type cgroups struct {
	hierarchies []hierarchy
	limits      Limits
	// mu orders creating an organization's directory with removing it once empty.
	mu sync.Mutex
	// stalled counts, by uid, the organization's processes that yield the CPU (a worker holds
	// their thread, or liveness killed one of the organization's lately): while any does, the
	// organization runs at StalledCPUWeight. held counts those whose thread a worker holds now,
	// and groups all of them: while every process of an organization is held, it is also of the
	// idle class where the kernel has cpu.idle.
	stalled, held, groups map[int]int
}

// discoverCgroups finds the runtime's own cgroups and decides which hierarchy sets each ceiling:
// a v1 hierarchy that serves it, else the v2 hierarchy when its cgroup offers it. It fails when a
// needed controller is nowhere (SPEC 5.1: a node that cannot set its ceilings does not start).
func discoverCgroups(limits Limits, node string) (*cgroups, error) {
	hs, err := ownHierarchies(node)
	if err != nil {
		return nil, err
	}
	c := &cgroups{hierarchies: hs, limits: limits}
	if err := c.prepare(); err != nil {
		return nil, err
	}
	if err := c.sweep(); err != nil {
		return nil, err
	}
	return c, nil
}

// RemoveNode removes what a node named node left in the cgroups of this process's own
// hierarchies, and its cgroups themselves: for a node that was killed and will not run again
// (one that stops cleanly, or starts again with its state directory, leaves none). Nothing is
// made where the node has no cgroup. The node must not be running.
func RemoveNode(node string) error {
	if !onePathElement(node) {
		return fmt.Errorf("sandbox node name %q is not one path element", node)
	}
	hs, err := ownHierarchies(node)
	if err != nil {
		return nil // no node could have made cgroups here
	}
	return (&cgroups{hierarchies: hs}).close()
}

// ownHierarchies finds the runtime's own cgroup in each hierarchy that serves a controller it
// needs, with the cgroup of node under it as the base.
func ownHierarchies(node string) ([]hierarchy, error) {
	procCgroup, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/cgroup: %w", err)
	}
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read /proc/self/mountinfo: %w", err)
	}
	hs := ownCgroups(procCgroup, mountinfo)
	served := map[string]bool{}
	for _, h := range hs {
		for _, c := range h.controllers {
			served[c] = true
		}
	}
	for i, h := range hs {
		if !h.v2 {
			continue
		}
		offered, err := os.ReadFile(filepath.Join(h.dir, "cgroup.controllers"))
		if err != nil {
			return nil, fmt.Errorf("cgroup v2 at %s: %w", h.dir, err)
		}
		for _, c := range strings.Fields(string(offered)) {
			if slices.Contains(neededControllers, c) && !served[c] {
				hs[i].controllers = append(hs[i].controllers, c)
				served[c] = true
			}
		}
	}
	var missing []string
	for _, c := range neededControllers {
		if !served[c] {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("no cgroup hierarchy of this node offers the %s controller(s) (found: %v)", strings.Join(missing, ", "), hs)
	}
	for i := range hs {
		hs[i].base = filepath.Join(hs[i].dir, node)
	}
	return hs, nil
}

// prepare makes the node's cgroup in each hierarchy, and on v2 makes the runtime's own cgroup and
// the node's hand the controllers down (which needs a cgroup without processes of its own unless
// it is the root: the v2 rule of no internal processes).
func (c *cgroups) prepare() error {
	for _, h := range c.hierarchies {
		if h.v2 {
			if err := enableSubtree(h.dir, h.controllers); err != nil {
				return err
			}
		}
		if err := os.Mkdir(h.base, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("cannot create cgroups under %s: %w", h.dir, err)
		}
		if h.serves(ctlMemory) && c.limits.NodeMemoryBytes > 0 {
			if err := writeAll(h.base, memoryFiles(h, c.limits.NodeMemoryBytes)); err != nil {
				return err
			}
		}
		if h.v2 {
			if err := enableSubtree(h.base, h.controllers); err != nil {
				return err
			}
		}
	}
	return nil
}

// sweep ends and removes what an earlier run of this node left in its cgroups (it was killed, and
// a sandbox set up in that moment outlived it). The state directory's lock makes this node the
// only one using them.
func (c *cgroups) sweep() error {
	for _, h := range c.hierarchies {
		orgs, err := os.ReadDir(h.base)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read cgroup %s: %w", h.base, err)
		}
		for _, org := range orgs {
			if !org.IsDir() || !strings.HasPrefix(org.Name(), "org-") {
				continue
			}
			dir := filepath.Join(h.base, org.Name())
			incs, err := os.ReadDir(dir)
			if err != nil {
				return fmt.Errorf("read cgroup %s: %w", dir, err)
			}
			for _, inc := range incs {
				if inc.IsDir() {
					if err := emptyAndRemove(filepath.Join(dir, inc.Name())); err != nil {
						return err
					}
				}
			}
			if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove cgroup %s: %w", dir, err)
			}
		}
	}
	return nil
}

// close sweeps the node's cgroups and removes them.
func (c *cgroups) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.sweep(); err != nil {
		return err
	}
	var errs []error
	for _, h := range c.hierarchies {
		if err := os.Remove(h.base); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove cgroup %s: %w", h.base, err))
		}
	}
	return errors.Join(errs...)
}

// enableSubtree turns on controllers for the children of a v2 cgroup.
func enableSubtree(dir string, controllers []string) error {
	if len(controllers) == 0 {
		return nil
	}
	on, err := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control"))
	if err != nil {
		return fmt.Errorf("cgroup v2 at %s: %w", dir, err)
	}
	have := strings.Fields(string(on))
	for _, ctl := range controllers {
		if slices.Contains(have, ctl) {
			continue
		}
		if err := writeFile(filepath.Join(dir, "cgroup.subtree_control"), "+"+ctl); err != nil {
			return fmt.Errorf("cgroup v2 at %s cannot hand the %s controller to its children (a v2 cgroup with processes of its own cannot; run the node in a delegated cgroup of its own): %w", dir, ctl, err)
		}
	}
	return nil
}

func writeFile(path, value string) error {
	// O_TRUNC, as a shell's redirection opens them: the kernel takes a cgroup file's value whole
	// anyway, and a plain file (a test's) then holds only the value.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// group is the cgroup of one incarnation's process, in every hierarchy.
type group struct {
	c      *cgroups
	uid    int
	memory int64    // its memory ceiling
	dirs   []string // one per hierarchy, in the order of c.hierarchies
	// stalled: its program yields the CPU, and its organization counts it so (setStalled); held:
	// a worker holds its thread now (setHeld); counted: its organization counts it among its
	// groups.
	stalled, held, counted bool
}

func orgName(uid int) string { return fmt.Sprintf("org-%d", uid) }

// create makes org-<uid>/<name> in every hierarchy with the ceilings written: memory and pids per
// process, CPU weight per organization (every organization the same, so that an organization
// gets an equal share however many processes it runs), CPU quota per process when set. A group
// created stalled counts so from the start (setStalled), and its organization's weight is
// written at StalledCPUWeight before any process enters it.
func (c *cgroups) create(uid int, name string, memory int64, stalled bool) (_ *group, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := &group{c: c, uid: uid, memory: c.processMemory(memory), counted: true}
	memory = g.memory
	count(&c.groups, uid, true)
	if stalled {
		count(&c.stalled, uid, true)
		g.stalled = true
	}
	defer func() {
		if err != nil {
			g.removeLocked()
		}
	}()
	for _, h := range c.hierarchies {
		org := filepath.Join(h.base, orgName(uid))
		if err := os.Mkdir(org, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return nil, fmt.Errorf("create cgroup %s: %w", org, err)
		}
		if err := c.writeOrg(h, org, uid); err != nil {
			return nil, err
		}
		dir := filepath.Join(org, name)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		g.dirs = append(g.dirs, dir)
		if err := c.writeIncarnation(h, dir, memory); err != nil {
			return nil, err
		}
	}
	return g, nil
}

func (c *cgroups) writeOrg(h hierarchy, org string, uid int) error {
	l := c.limits
	var files [][2]string
	if h.serves(ctlMemory) && l.OrgMemoryBytes > 0 {
		files = append(files, memoryFiles(h, l.OrgMemoryBytes)...)
	}
	if h.serves(ctlPids) && l.OrgPids > 0 {
		files = append(files, [2]string{"pids.max", strconv.FormatInt(l.OrgPids, 10)})
	}
	if h.serves(ctlCPU) {
		files = append(files, cpuFiles(h, c.cpuStateLocked(uid))...)
	}
	if err := writeAll(org, files); err != nil {
		return err
	}
	if h.v2 {
		return enableSubtree(org, h.controllers)
	}
	return nil
}

// cpuWeightFile sets a CPU weight (v2's scale, 1-10000; v1 cpu.shares gets it scaled, at least 2).
func cpuWeightFile(h hierarchy, weight int) [2]string {
	if h.v2 {
		return [2]string{"cpu.weight", strconv.Itoa(weight)}
	}
	return [2]string{"cpu.shares", strconv.Itoa(max(2, weight*1024/100))}
}

// cpuState is how an organization's CPU files read.
type cpuState struct {
	weight int
	idle   bool
}

// cpuStateLocked is the CPU state organization uid runs in now (c.mu held).
func (c *cgroups) cpuStateLocked(uid int) cpuState {
	st := cpuState{weight: c.limits.CPUWeight}
	if c.stalled[uid] > 0 {
		st.weight = StalledCPUWeight
	}
	st.idle = c.held[uid] > 0 && c.held[uid] >= c.groups[uid]
	return st
}

// cpuFiles are the CPU files of an organization's cgroup in h for st, in the order to write them.
// Where the kernel has cpu.idle, an organization every process of which a worker holds is also of
// the idle class: a thread of any other organization that wakes takes the CPU from it at once,
// where the least weight alone still lets it run out its slice. It serves no one meanwhile, and
// one process of it that answers takes it out of the class (beside a quarantined loop, its
// organization's other workers keep the least weight's share on a saturated node, not none).
// An idle group's weight cannot be written (the kernel refuses it), so the weight goes first into
// the class and last out of it.
func cpuFiles(h hierarchy, st cpuState) [][2]string {
	weight := cpuWeightFile(h, st.weight)
	if !exists(filepath.Join(h.base, "cpu.idle")) {
		return [][2]string{weight}
	}
	if st.idle {
		return [][2]string{weight, {"cpu.idle", "1"}}
	}
	return [][2]string{{"cpu.idle", "0"}, weight}
}

// count counts one of uid's processes in or out of m.
func count(m *map[int]int, uid int, in bool) {
	if *m == nil {
		*m = map[int]int{}
	}
	if in {
		(*m)[uid]++
	} else if (*m)[uid]--; (*m)[uid] <= 0 {
		delete(*m, uid)
	}
}

// updateCPULocked writes organization uid's CPU files when its state moved from before (c.mu
// held).
func (c *cgroups) updateCPULocked(uid int, before cpuState) error {
	after := c.cpuStateLocked(uid)
	if after == before {
		return nil
	}
	var errs []error
	for _, h := range c.hierarchies {
		if !h.serves(ctlCPU) {
			continue
		}
		org := filepath.Join(h.base, orgName(uid))
		if !exists(org) {
			continue
		}
		errs = append(errs, writeAll(org, cpuFiles(h, after)))
	}
	return errors.Join(errs...)
}

func (c *cgroups) writeIncarnation(h hierarchy, dir string, memory int64) error {
	l := c.limits
	var files [][2]string
	if h.serves(ctlMemory) {
		files = append(files, memoryFiles(h, memory)...)
		if h.v2 {
			// An OOM kill ends the whole incarnation, not one process of it.
			files = append(files, [2]string{"memory.oom.group", "1"})
		}
	}
	if h.serves(ctlPids) {
		files = append(files, [2]string{"pids.max", strconv.FormatInt(l.Pids, 10)})
	}
	if h.serves(ctlCPU) && l.CPUMax > 0 {
		const period = 100000
		quota := int64(l.CPUMax * period)
		if h.v2 {
			files = append(files, [2]string{"cpu.max", fmt.Sprintf("%d %d", quota, period)})
		} else {
			files = append(files, [2]string{"cpu.cfs_period_us", strconv.Itoa(period)}, [2]string{"cpu.cfs_quota_us", strconv.FormatInt(quota, 10)})
		}
	}
	return writeAll(dir, files)
}

// processMemory is the ceiling a process gets for asking memory: Limits.MemoryBytes when it asks
// none, never more than its organization's.
func (c *cgroups) processMemory(memory int64) int64 {
	if memory <= 0 {
		memory = c.limits.MemoryBytes
	}
	if org := c.limits.OrgMemoryBytes; org > 0 && memory > org {
		memory = org
	}
	return memory
}

// setMemory changes the group's memory ceiling in place. On v1 the limit must never exceed the
// limit with swap, so a raise writes memsw first and a cut writes it last.
func (g *group) setMemory(memory int64) error {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	memory = g.c.processMemory(memory)
	if memory == g.memory || len(g.dirs) == 0 {
		return nil
	}
	for i, h := range g.c.hierarchies {
		if !h.serves(ctlMemory) {
			continue
		}
		files := memoryFiles(h, memory)
		if !h.v2 && memory > g.memory {
			files[0], files[1] = files[1], files[0]
		}
		if err := writeAll(g.dirs[i], files); err != nil {
			return err
		}
	}
	g.memory = memory
	return nil
}

// memoryFiles set a memory ceiling with no swap beyond it: v2 memory.max and memory.swap.max; v1
// memory and memory plus swap at the same value, so that swap never extends it.
func memoryFiles(h hierarchy, bytes int64) [][2]string {
	mem := strconv.FormatInt(bytes, 10)
	if h.v2 {
		return [][2]string{{"memory.max", mem}, {"memory.swap.max", "0"}}
	}
	return [][2]string{{"memory.limit_in_bytes", mem}, {"memory.memsw.limit_in_bytes", mem}}
}

// writeAll writes each file; a swap file the kernel does not have (no swap accounting) is the one
// file that may be missing.
func writeAll(dir string, files [][2]string) error {
	for _, f := range files {
		path := filepath.Join(dir, f[0])
		if (f[0] == "memory.swap.max" || f[0] == "memory.memsw.limit_in_bytes" || f[0] == "memory.oom.group") && !exists(path) {
			continue
		}
		if err := writeFile(path, f[1]); err != nil {
			return fmt.Errorf("set %s to %s: %w", path, f[1], err)
		}
	}
	return nil
}

// place moves a process into the group in every hierarchy; its children are born there.
func (g *group) place(pid int) error {
	for _, dir := range g.dirs {
		if err := writeFile(filepath.Join(dir, "cgroup.procs"), strconv.Itoa(pid)); err != nil {
			return fmt.Errorf("place process %d in cgroup %s: %w", pid, dir, err)
		}
	}
	return nil
}

// procs lists the processes in the group (in its first hierarchy: every one holds the same).
func (g *group) procs() []int {
	if len(g.dirs) == 0 {
		return nil
	}
	return readPids(filepath.Join(g.dirs[0], "cgroup.procs"))
}

func readPids(path string) []int {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// limitHit says which ceiling the group's processes ran into, if any: an OOM kill at the memory
// ceiling, or a refused fork or thread at the pids ceiling.
func (g *group) limitHit() string {
	var hits []string
	for i, h := range g.c.hierarchies {
		dir := g.dirs[i]
		if h.serves(ctlMemory) {
			file := "memory.events"
			if !h.v2 {
				file = "memory.oom_control"
			}
			if n := counter(filepath.Join(dir, file), "oom_kill"); n > 0 {
				hits = append(hits, fmt.Sprintf("killed at its memory ceiling (%d MiB)", g.memory>>20))
			}
		}
		if h.serves(ctlPids) {
			if n := counter(filepath.Join(dir, "pids.events"), "max"); n > 0 {
				hits = append(hits, fmt.Sprintf("refused %d new tasks at its pids ceiling (%d)", n, g.c.limits.Pids))
			}
		}
	}
	return strings.Join(hits, "; ")
}

// counter reads one "key value" line of a cgroup event file.
func counter(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// remove kills whatever is left in the group, removes its directories and the organization's
// directories once they hold no other incarnation.
func (g *group) remove() error {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	return g.removeLocked()
}

// setStalled says whether the group's program is stalled: a worker holds its thread (a liveness
// probe missed). While any process of an organization is, the organization runs at
// StalledCPUWeight, so that on a busy node its loop takes CPU from no other organization's
// answers; an idle node still gives it all it asks, so a long synchronous request is slowed only
// where others wait for the CPU, and ended, as before, only by the liveness bound.
func (g *group) setStalled(stalled bool) error {
	return g.setCounted(&g.stalled, &g.c.stalled, stalled)
}

// setHeld says whether a worker holds the group's program's thread now (a liveness probe has
// gone unanswered while nothing else answered): while every process of an organization is held,
// the organization is also of the idle class (cpuFiles).
func (g *group) setHeld(held bool) error {
	return g.setCounted(&g.held, &g.c.held, held)
}

// setCounted sets one of the group's flags, counted in its organization's m, and writes the
// organization's CPU files when that moves them.
func (g *group) setCounted(flag *bool, m *map[int]int, v bool) error {
	g.c.mu.Lock()
	defer g.c.mu.Unlock()
	if *flag == v || len(g.dirs) == 0 {
		return nil
	}
	before := g.c.cpuStateLocked(g.uid)
	count(m, g.uid, v)
	if err := g.c.updateCPULocked(g.uid, before); err != nil {
		// Undo the count, so that the group, the count and its caller agree that nothing
		// changed, and a later call tries the write again.
		count(m, g.uid, !v)
		return err
	}
	*flag = v
	return nil
}

func (g *group) removeLocked() error {
	// Its counts go first: what is left of a killed program runs no more of its code, and frees
	// its memory faster at its organization's own weight (c.mu is held meanwhile).
	before := g.c.cpuStateLocked(g.uid)
	for _, c := range []struct {
		flag *bool
		m    *map[int]int
	}{{&g.stalled, &g.c.stalled}, {&g.held, &g.c.held}, {&g.counted, &g.c.groups}} {
		if *c.flag {
			*c.flag = false
			count(c.m, g.uid, false)
		}
	}
	errs := []error{g.c.updateCPULocked(g.uid, before)}
	for _, dir := range g.dirs {
		if err := emptyAndRemove(dir); err != nil {
			errs = append(errs, err)
		}
		// Another incarnation of the organization keeps it busy: that one removes it later.
		_ = os.Remove(filepath.Dir(dir))
	}
	g.dirs = nil
	return errors.Join(errs...)
}

// emptyAndRemove kills the processes left in a cgroup (the sandbox's init takes its children
// with it, but nothing is left to chance) and removes it once the kernel has let them go.
func emptyAndRemove(dir string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		if exists(filepath.Join(dir, "cgroup.kill")) {
			_ = writeFile(filepath.Join(dir, "cgroup.kill"), "1")
		} else {
			for _, pid := range readPids(filepath.Join(dir, "cgroup.procs")) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		err := os.Remove(dir)
		if err == nil || errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", dir, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
