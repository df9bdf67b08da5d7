package netlisten_test

import (
	"context"
	"errors"
	"net"
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
