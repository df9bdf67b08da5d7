package server

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// TestBucketSpendsRefillsAndSaysHowLongToWait is the token bucket as a pure function of time.
func TestBucketSpendsRefillsAndSaysHowLongToWait(t *testing.T) {
	t.Parallel()
	r := catalog.Rates{PerSecond: 4, Burst: 2}
	t0 := time.Unix(1000, 0)
	b := &bucket{tokens: 2, at: t0}
	for _, step := range []struct {
		after time.Duration
		ok    bool
		wait  time.Duration
	}{
		{0, true, 0},
		{0, true, 0},
		{0, false, 250 * time.Millisecond}, // empty: one token in 1/4 s
		{100 * time.Millisecond, false, 150 * time.Millisecond}, // 0.4 of a token back
		{250 * time.Millisecond, true, 0},                       // one token back
		{10 * time.Second, true, 0},                             // refilled to the burst, no more
		{10 * time.Second, true, 0},
		{10 * time.Second, false, 250 * time.Millisecond},
	} {
		ok, wait := b.take(t0.Add(step.after), r)
		require.Equal(t, step.ok, ok, "at %s", step.after)
		require.InDelta(t, float64(step.wait), float64(wait), float64(time.Millisecond), "at %s", step.after)
	}
}

// The default rate throttles no ordinary use of the provider: the refresh of a 1,000-resource
// configuration at once, then a 100-resource plan (101 requests) every second for a minute. A key
// in a loop at 1,000 requests a second gets about the sustained rate.
func TestTheDefaultRateTakesRefreshesOfLargeConfigurations(t *testing.T) {
	t.Parallel()
	rates := catalog.Rates{PerSecond: catalog.DefaultRatePerSecond, Burst: catalog.DefaultRateBurst}
	k := newKeyBuckets(rates)
	t0 := time.Unix(1000, 0)
	for i := range 1000 {
		ok, _ := k.take("key_a", t0)
		require.True(t, ok, "request %d of the first refresh", i)
	}
	for second := range 60 {
		for i := range 101 {
			ok, _ := k.take("key_a", t0.Add(time.Duration(second+10)*time.Second+time.Duration(i)*time.Millisecond))
			require.True(t, ok, "request %d of the plan at %d s", i, second)
		}
	}

	admitted := 0
	for i := range 10_000 { // ten seconds at 1,000 a second
		if ok, _ := k.take("key_b", t0.Add(time.Duration(i)*time.Millisecond)); ok {
			admitted++
		}
	}
	require.InDelta(t, rates.Burst+10*int(rates.PerSecond), admitted, 2, "a loop gets the burst and the rate, no more")
}

// TestBucketsOfIdleKeysAreForgotten: the map holds only keys whose buckets have not refilled.
func TestBucketsOfIdleKeysAreForgotten(t *testing.T) {
	t.Parallel()
	k := newKeyBuckets(catalog.Rates{PerSecond: 1, Burst: 5})
	t0 := time.Unix(1000, 0)
	k.take("key_a", t0)
	k.take("key_b", t0)
	for range 5 {
		k.take("key_b", t0.Add(sweepEvery-time.Second))
	}
	k.take("key_c", t0.Add(sweepEvery))
	require.Len(t, k.buckets, 2, "key_a refilled and went; key_b is still short; key_c is new")
	require.Contains(t, k.buckets, "key_b")
}

// BenchmarkKeyBucketsTake is the limiter's cost on a request, for BenchmarkRateBucket's
// comparison.
func BenchmarkKeyBucketsTake(b *testing.B) {
	k := newKeyBuckets(catalog.Rates{PerSecond: 1e9, Burst: 1e6})
	for b.Loop() {
		k.take("key_abcdefgh", time.Now())
	}
}
