// Package netlisten opens a service's TCP listeners the way a restarted service needs: an address
// its previous process still holds (EADDRINUSE, while it drains) is tried again for a while
// before the start gives up.
package netlisten

import (
	"context"
	"errors"
	"net"
	"syscall"
	"time"
)

// Every is how often a busy address is tried again.
const Every = 250 * time.Millisecond

// Listen opens a TCP listener on addr. While the address is in use it tries again every Every for
// up to wait (zero: once), calling busy once, on the first refusal; ctx ends the wait early. Any
// other error is returned at once.
func Listen(ctx context.Context, addr string, wait time.Duration, busy func(error)) (net.Listener, error) {
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
