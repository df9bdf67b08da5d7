package runtime

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// A descriptor the node inherited without close-on-exec gets it before any sandbox starts.
func TestInheritedDescriptorsAreClosedOnExec(t *testing.T) {
	f, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fd := f.Fd()
	flags := func() uintptr {
		v, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_GETFD, 0)
		if errno != 0 {
			t.Fatal(errno)
		}
		return v
	}
	if _, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_SETFD, 0); errno != 0 {
		t.Fatal(errno)
	}
	if flags()&syscall.FD_CLOEXEC != 0 {
		t.Fatal("the descriptor kept close-on-exec")
	}
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var release []byte
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		release = append(release, byte(c))
	}
	var major, minor int
	if _, err := fmt.Sscanf(string(release), "%d.%d", &major, &minor); err == nil && (major < 5 || (major == 5 && minor < 11)) {
		t.Skipf("Linux %s has no close_range(CLOSE_RANGE_CLOEXEC)", release)
	}
	closeInheritedOnExec()
	if flags()&syscall.FD_CLOEXEC == 0 {
		t.Fatal("an inherited descriptor would reach the sandboxes")
	}
}
