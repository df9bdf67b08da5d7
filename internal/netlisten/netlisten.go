// Package netlisten opens a service's TCP listeners the way a restarted service needs: an address
// its previous process still holds (EADDRINUSE, while it drains) is tried again for a while
// before the start gives up; and a listening socket the process inherited (fd:N, from systemd's
// socket activation or a supervisor) is adopted, so that the socket outlives every restart and no
// connection is refused between two processes (they wait in its backlog instead).
package netlisten

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// inheritedPrefix names an inherited descriptor instead of an address: fd:3.
const inheritedPrefix = "fd:"

// Inherited reports whether addr names an inherited descriptor (fd:N) rather than an address.
func Inherited(addr string) bool { return strings.HasPrefix(addr, inheritedPrefix) }

// adopt makes a listener of the inherited descriptor addr names; it must be a listening TCP
// socket.
func adopt(addr string) (net.Listener, error) {
	fd, err := strconv.Atoi(strings.TrimPrefix(addr, inheritedPrefix))
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s: an inherited listener is fd:N with N at least 3 (0-2 are standard streams)", addr)
	}
	f := os.NewFile(uintptr(fd), addr)
	if f == nil {
		return nil, fmt.Errorf("%s: no such descriptor", addr)
	}
	defer f.Close() // the listener holds a duplicate
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%s is not a listening socket: %w", addr, err)
	}
	if _, ok := l.Addr().(*net.TCPAddr); !ok {
		l.Close()
		return nil, fmt.Errorf("%s is not a TCP socket (%s)", addr, l.Addr().Network())
	}
	return l, nil
}

// Every is how often a busy address is tried again.
const Every = 250 * time.Millisecond

// Listen opens a TCP listener on addr, or adopts the inherited one addr names (fd:N). While an
// address is in use it tries again every Every for up to wait (zero: once), calling busy once, on
// the first refusal; ctx ends the wait early. Any other error is returned at once.
func Listen(ctx context.Context, addr string, wait time.Duration, busy func(error)) (net.Listener, error) {
	if Inherited(addr) {
		return adopt(addr)
	}
	deadline := time.Now().Add(wait)
	for first := true; ; first = false {
		l, err := net.Listen("tcp", addr)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) || !time.Now().Before(deadline) {
			return l, err
		}
		if first && busy != nil {
			busy(err)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(min(Every, time.Until(deadline))):
		}
	}
}
