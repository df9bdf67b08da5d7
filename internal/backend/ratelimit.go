package backend

import (
	"context"
	"fmt"
	"time"
)

// RateBudget is the per-installation budget of a backend's API calls, shared by every Host replica
// (SPEC 8 "Rate limits": Cloudflare allows 1,200 requests per 5 minutes per token, then blocks
// every call for 5 minutes). The Host keeps it in PostgreSQL (package ratebudget).
type RateBudget interface {
	// Take takes n calls of the installation's budget, or takes nothing and answers how long until
	// it could (the installation is blocked, or its bucket is short).
	Take(ctx context.Context, installation string, n int) (time.Duration, error)
	// Block records a 429's Retry-After: the installation takes nothing until it has passed.
	Block(ctx context.Context, installation string, retryAfter time.Duration) error
}

// RateLimitedError is a backend call refused for its installation's rate limit, which no retry
// within the request could wait out: nothing was applied, and the request may be sent again after
// RetryAfter (the Host answers 503 with Retry-After).
type RateLimitedError struct {
	Installation string
	RetryAfter   time.Duration
}

func (e *RateLimitedError) Error() string {
	return fmt.Sprintf("installation %s is rate-limited by Cloudflare's API; retry after %s", e.Installation, e.RetryAfter.Round(time.Second))
}
