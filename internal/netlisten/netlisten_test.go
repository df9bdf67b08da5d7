package netlisten_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/netlisten"
)

// An address another listener holds is tried again until it is let go, within the wait; past
// the wait, or with no wait, the start fails with EADDRINUSE; the busy callback runs once.
func TestABusyAddressIsTriedAgainWithinTheWait(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := held.Addr().String()

	_, err = netlisten.Listen(context.Background(), addr, 0, nil)
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "no wait: at once: %v", err)

	calls := 0
	start := time.Now()
	_, err = netlisten.Listen(context.Background(), addr, 600*time.Millisecond, func(error) { calls++ })
	require.True(t, errors.Is(err, syscall.EADDRINUSE), "%v", err)
	require.GreaterOrEqual(t, time.Since(start), 600*time.Millisecond, "it waited")
	require.Equal(t, 1, calls)

	go func() { time.Sleep(300 * time.Millisecond); held.Close() }()
	l, err := netlisten.Listen(context.Background(), addr, 10*time.Second, nil)
	require.NoError(t, err, "taken once the previous holder let go")
	require.Equal(t, addr, l.Addr().String())
	require.NoError(t, l.Close())
}

// An inherited descriptor (fd:N) is adopted as the listener it is, on its own address, and keeps
// listening after the adopter closes its listener while another holder keeps a copy (as systemd
// does across restarts). A descriptor that is no listening TCP socket, or a standard stream, is
// refused, named.
func TestAnInheritedListenerIsAdoptedAndOutlivesItsAdopter(t *testing.T) {
	t.Parallel()
	held, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	f, err := held.(*net.TCPListener).File()
	require.NoError(t, err)
	defer f.Close()
	addr := held.Addr().String()
	require.NoError(t, held.Close())
	// What a started process inherits is a descriptor of its own: a duplicate of the holder's.
	inherit := func() string {
		fd, err := syscall.Dup(int(f.Fd()))
		require.NoError(t, err)
		return fmt.Sprintf("fd:%d", fd)
	}
	name := inherit()
	require.True(t, netlisten.Inherited(name))

	l, err := netlisten.Listen(context.Background(), name, 0, nil)
	require.NoError(t, err)
	require.Equal(t, addr, l.Addr().String())
	require.NoError(t, l.Close())
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	require.NoError(t, err, "the socket still listens: the next adopter will accept this connection")
	defer conn.Close()
	again, err := netlisten.Listen(context.Background(), inherit(), 0, nil)
	require.NoError(t, err)
	accepted, err := again.Accept()
	require.NoError(t, err, "the connection made between two adopters waited in the backlog")
	require.NoError(t, accepted.Close())
	require.NoError(t, again.Close())

	file, err := os.CreateTemp(t.TempDir(), "plain")
	require.NoError(t, err)
	defer file.Close()
	_, err = netlisten.Listen(context.Background(), fmt.Sprintf("fd:%d", file.Fd()), 0, nil)
	require.ErrorContains(t, err, "is not a listening socket")
	_, err = netlisten.Listen(context.Background(), "fd:1", 0, nil)
	require.ErrorContains(t, err, "at least 3")
	_, err = netlisten.Listen(context.Background(), "fd:x", 0, nil)
	require.ErrorContains(t, err, "fd:N")
}
