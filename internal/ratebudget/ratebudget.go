// Package ratebudget keeps each Cloudflare installation's API budget in PostgreSQL (SPEC 8 "Rate
// limits"), so that every Host replica takes from one bucket and waits out one block.
//
// Cloudflare allows 1,200 requests per 5 minutes per token and then refuses every call for 5
// minutes. The bucket refills at PerSecond up to Capacity, chosen so that Capacity + 300 s ×
// PerSecond stays under 1,200 with room for the operator's own calls; a 429's Retry-After blocks
// the installation until it has passed.
package ratebudget

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
)

// Defaults: 200 + 300 × 3 = 1,100 calls in any 5 minutes at most, and no organization takes more
// than half of that.
const (
	DefaultCapacity  = 200
	DefaultPerSecond = 3
	DefaultShare     = 0.5
)

// Budget is the budget of every installation, in one database.
type Budget struct {
	DB        dbsqlc.DBTX
	Capacity  float64
	PerSecond float64
	// Share is the part of an installation's capacity and rate one organization may take: a
	// call made for an organization takes from its share too, so that one organization's loop
	// slows itself and leaves the rest to the others.
	Share float64
}

// New returns the budget kept in db, with the default rates.
func New(db dbsqlc.DBTX) *Budget {
	return &Budget{DB: db, Capacity: DefaultCapacity, PerSecond: DefaultPerSecond, Share: DefaultShare}
}

type organizationKey struct{}

// WithOrganization marks ctx as carrying calls made for an organization's request: Take charges
// them to its share as well.
func WithOrganization(ctx context.Context, organization string) context.Context {
	return context.WithValue(ctx, organizationKey{}, organization)
}

// Take takes n calls of installation's budget (and, for an organization's request, of its share),
// or takes nothing and answers how long until it could.
func (b *Budget) Take(ctx context.Context, installation string, n int) (time.Duration, error) {
	q := dbsqlc.New(b.DB)
	var wait float64
	var err error
	if org, _ := ctx.Value(organizationKey{}).(string); org != "" && b.Share > 0 && b.Share < 1 {
		wait, err = q.RateBudgetTakeShared(ctx, dbsqlc.RateBudgetTakeSharedParams{
			Installation: installation, Organization: org, N: int32(n), Capacity: b.Capacity, PerSecond: b.PerSecond, Share: b.Share,
		})
	} else {
		wait, err = q.RateBudgetTake(ctx, dbsqlc.RateBudgetTakeParams{
			Installation: installation, N: int32(n), Capacity: b.Capacity, PerSecond: b.PerSecond,
		})
	}
	if err != nil {
		return 0, fmt.Errorf("ratebudget: take: %w", err)
	}
	if wait <= 0 {
		return 0, nil
	}
	return time.Duration(math.Ceil(wait*1000)) * time.Millisecond, nil
}

// Block records a 429's Retry-After for installation.
func (b *Budget) Block(ctx context.Context, installation string, retryAfter time.Duration) error {
	if _, err := dbsqlc.New(b.DB).RateBudgetBlock(ctx, dbsqlc.RateBudgetBlockParams{Installation: installation, RetrySeconds: retryAfter.Seconds()}); err != nil {
		return fmt.Errorf("ratebudget: block: %w", err)
	}
	return nil
}
