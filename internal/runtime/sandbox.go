package runtime

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/sandbox"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
)

// ErrCannotSandbox means the node lacks what its sandbox needs (SPEC 5.1) and was not told
// --insecure-no-sandbox.
var ErrCannotSandbox = errors.New("this runtime node cannot sandbox its workers")

// insecureWarning is logged at every start of a node without its sandbox.
const insecureWarning = "THE OS SANDBOX IS OFF (--insecure-no-sandbox): every worker runs as this node's own user with no " +
	"namespaces and no memory, CPU or pids ceilings; any worker's process can read every other worker's secrets " +
	"(/proc/<pid>/environ) and this node's sealing key and admin token. Run only code you trust like this."

// openSandbox sets up the sandbox every incarnation runs in (SPEC 5.1), and proves it by running
// workerd --version through it. A node that cannot sandbox refuses to start, unless it was told
// --insecure-no-sandbox; then it says so at every start and in its status.
func (n *Node) openSandbox(workerdBin string) error {
	if n.cfg.InsecureNoSandbox {
		n.log.Warn(insecureWarning, "uid", os.Getuid())
		return nil
	}
	cfg := n.cfg.Sandbox
	if cfg.Node == "" {
		cfg.Node = sandbox.NodeName(n.store.Dir())
	}
	sb, err := sandbox.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w. It needs root (or CAP_SETUID and CAP_SETGID with a delegated cgroup), bubblewrap, and cgroups it may create for memory, cpu and pids; --insecure-no-sandbox runs every worker as the node's own user instead (never for code you do not trust)", ErrCannotSandbox, err)
	}
	for _, org := range slices.Sorted(maps.Keys(n.desired.OrgUIDs)) {
		// An organization keeps its uid: a range that no longer holds it is the operator's to fix.
		if uid := n.desired.OrgUIDs[org]; !sb.UIDs().Contains(uid) {
			_ = sb.Close()
			return fmt.Errorf("organization %q runs as uid %d, outside --sandbox-uid-range %s: an organization keeps its uid, so widen the range to hold it", org, uid, sb.UIDs())
		}
	}
	if err := selfTest(sb, workerdBin, n.desired.OrgUIDs); err != nil {
		_ = sb.Close()
		return fmt.Errorf("%w: %w", ErrCannotSandbox, err)
	}
	n.sandbox = sb
	n.log.Info("workers run sandboxed, one uid per organization", "sandbox", sb.Describe())
	return nil
}

// selfTest runs workerd --version in the sandbox, as a uid no organization holds.
func selfTest(sb *sandbox.Sandbox, workerdBin string, held map[string]int) error {
	uid, err := sandbox.AllocateUID(sb.UIDs(), held, os.Getuid(), accountExists)
	if err != nil {
		return err
	}
	// Standard output and error are copied on goroutines of their own: one locked buffer takes both.
	var out lockedBuilder
	p, err := sb.Start(sandbox.Program{Path: workerdBin, Args: []string{"--version"}, UID: uid,
		Name: "selftest-" + rand.Text(), Stdout: &out, Stderr: &out})
	if err != nil {
		return fmt.Errorf("start workerd --version in the sandbox: %w", err)
	}
	if err := p.Wait(); err != nil {
		return fmt.Errorf("workerd --version in the sandbox: %w: %s", err, strings.TrimSpace(out.String()))
	}
	if !strings.Contains(out.String(), "workerd") {
		return fmt.Errorf("workerd --version in the sandbox answered %q", out.String())
	}
	return nil
}

// lockedBuilder is a strings.Builder that several goroutines may write to.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// accountExists reports whether uid names an account of this machine: such a uid may own files or
// processes, so no organization gets it.
func accountExists(uid int) bool {
	_, err := user.LookupId(strconv.Itoa(uid))
	var unknown user.UnknownUserIdError
	return !errors.As(err, &unknown)
}

// channelsDir makes (or checks) the directory under which each org process gets its socket
// directory. It holds nothing but those directories, each its organization's uid's and 0700; it
// is 0711 so that bubblewrap, running as an organization's uid, can reach that organization's
// directory by its path (it resolves a bound directory by path), and may be in a world-writable
// place: an existing path that is not the node's own 0711 directory is refused, never repaired.
func (n *Node) channelsDir() (string, error) {
	dir := n.cfg.ChannelsDir
	if dir == "" {
		sum := sha256.Sum256([]byte(n.store.Dir()))
		dir = filepath.Join(os.TempDir(), "takoform-runtime-"+hex.EncodeToString(sum[:6]))
	}
	if err := os.Mkdir(dir, channelsMode); err == nil {
		if err := os.Chmod(dir, channelsMode); err != nil {
			return "", err
		}
	} else if !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("create the org processes' channels directory: %w", err)
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, _ := info.Sys().(*syscall.Stat_t)
	switch {
	case !info.IsDir() || info.Mode()&fs.ModeSymlink != 0:
		return "", &safedir.UnsafePathError{Path: dir, Reason: "it is not a directory"}
	case st == nil || int(st.Uid) != os.Geteuid():
		return "", &safedir.UnsafePathError{Path: dir, Reason: "another user owns it"}
	case info.Mode().Perm() != channelsMode:
		return "", &safedir.UnsafePathError{Path: dir, Reason: fmt.Sprintf("its mode is %#o, want %#o", info.Mode().Perm(), channelsMode)}
	}
	return dir, nil
}

// channelsMode lets organizations' uids traverse the channels directory, not list it.
const channelsMode fs.FileMode = 0o711

// closeSandbox removes the node's cgroups once every incarnation has stopped.
func (n *Node) closeSandbox() {
	if n.sandbox == nil {
		return
	}
	if err := n.sandbox.Close(); err != nil {
		n.log.Error("remove the node's cgroups", "error", err)
	}
}

// sandboxMode is the node status's sandbox field.
func (n *Node) sandboxMode() string {
	if n.sandbox == nil {
		return adminapi.SandboxOff
	}
	return adminapi.SandboxBwrap
}

// orgUIDLocked answers the sandbox uid of an organization, allocating and persisting one the first
// time (n.mu held for writing). Without a sandbox there is none.
func (n *Node) orgUIDLocked(organization string) (int, error) {
	if n.sandbox == nil {
		return 0, nil
	}
	if uid, ok := n.desired.OrgUIDs[organization]; ok {
		return uid, nil
	}
	uid, err := sandbox.AllocateUID(n.sandbox.UIDs(), n.desired.OrgUIDs, os.Getuid(), accountExists)
	if err != nil {
		return 0, err
	}
	next, a := desired.Apply(*n.desired, desired.AssignOrgUID{Organization: organization, UID: uid})
	if a.Refused != nil {
		return 0, a.Refused
	}
	if err := n.store.Save(&next); err != nil {
		return 0, fmt.Errorf("persist the sandbox uid of an organization: %w", err)
	}
	n.desired = &next
	n.log.Info("organization given its sandbox uid", "organization", organization, "uid", uid)
	return uid, nil
}
