package cloudflare

import (
	"context"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
)

// Bounds of the pack's waiting for its rate budget within one request.
const (
	// maxRateWait is the longest a call waits for the budget in all, whatever its context allows.
	maxRateWait = 10 * time.Second
	// maxRateBackoff caps one pause between tries.
	maxRateBackoff = 2 * time.Second
	// defaultRetryAfter is assumed for a 429 without Retry-After.
	defaultRetryAfter = time.Second
)

// call makes one Cloudflare API call within the installation's rate budget: it takes one call of
// the budget first, and records a 429's Retry-After as the installation's block (every replica
// then waits it out without calling). A call meeting the block or a short bucket is tried again
// after a capped pause while the request's time allows (a 429 applied nothing, so trying again
// is safe even for a secret-bearing upload), and otherwise fails with a RateLimitedError.
func (c *cloudflareScripts) call(ctx context.Context, fn func() error) error {
	deadline := time.Now().Add(maxRateWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		wait, err := c.take(ctx, 1)
		if err != nil {
			return err
		}
		if wait == 0 {
			err = fn()
			e, ok := AsAPIError(err)
			if !ok || !e.IsRateLimited() {
				return err
			}
			wait = e.RetryAfter
			if wait <= 0 {
				wait = defaultRetryAfter
			}
			if c.budget != nil {
				if err := c.budget.Block(context.WithoutCancel(ctx), c.inst.Name, wait); err != nil {
					return err
				}
			}
		}
		if time.Now().Add(wait).After(deadline) {
			return &backend.RateLimitedError{Installation: c.inst.Name, RetryAfter: wait}
		}
		pause := min(wait, maxRateBackoff)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pause):
		}
	}
}

func (c *cloudflareScripts) take(ctx context.Context, n int) (time.Duration, error) {
	if c.budget == nil {
		return 0, nil
	}
	return c.budget.Take(ctx, c.inst.Name, n)
}

// deliveryCalls is what one runtime-input delivery takes of the budget at most: the settings and
// content readbacks, the upload, the readback after it, and a resend with its readbacks. Each of
// those calls takes its own call again when it is made: the reservation is headroom, so that a
// claimed delivery does not meet an empty bucket.
const deliveryCalls = 8

// ReserveDelivery takes, before a runtime input is claimed, the budget its delivery needs (SPEC
// 8). A short bucket is waited for within the request; while the installation is blocked longer
// than that, it answers a RateLimitedError and the Host claims nothing, because a 429 after the
// dispatch compare-and-swap would destroy a one-shot delivery.
func (c *cloudflareScripts) ReserveDelivery(ctx context.Context) error {
	// A token Cloudflare refuses or a place that is not where the catalog says fails here too,
	// before the claim, rather than after the compare-and-swap.
	if _, err := c.api(ctx); err != nil {
		return err
	}
	deadline := time.Now().Add(maxRateWait)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	for {
		wait, err := c.take(ctx, deliveryCalls)
		if err != nil || wait == 0 {
			return err
		}
		if time.Now().Add(wait).After(deadline) {
			return &backend.RateLimitedError{Installation: c.inst.Name, RetryAfter: wait}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(min(wait, maxRateBackoff)):
		}
	}
}
