package server

import (
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// The per-key request rate (SPEC 5.1) is a token bucket per API key kept in this replica's memory,
// not in PostgreSQL. A shared bucket would make the limit exact across replicas, but it costs a
// write on every request, reads included: a round trip, a row lock every request of the key
// queues on, and a WAL flush at commit. BenchmarkRateBucket measured it on a PostgreSQL with its
// default durability (fsync and synchronous_commit on, 2 cores): an authenticated request's
// database work went from 0.09 ms to 2.9 ms (2.0 ms each with 8 clients of one key at once),
// where this bucket costs 0.1 µs (BenchmarkKeyBucketsTake). That is too much to pay on every
// request to refuse requests that are cheap to serve. Behind N replicas a key therefore gets up
// to N times the configured rate; the ceilings that protect the backends (the quotas) are exact,
// in the database. The limiter runs after authentication, so it counts only requests of known
// keys.

// bucket is one key's token bucket: tokens left at time at.
type bucket struct {
	tokens float64
	at     time.Time
}

// take spends one token from b at now with rate r, refilling first. It reports whether a token was
// there and, when none was, how long until one is.
func (b *bucket) take(now time.Time, r catalog.Rates) (bool, time.Duration) {
	if elapsed := now.Sub(b.at).Seconds(); elapsed > 0 {
		b.tokens = math.Min(float64(r.Burst), b.tokens+elapsed*r.PerSecond)
		b.at = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0
	}
	return false, time.Duration((1 - b.tokens) / r.PerSecond * float64(time.Second))
}

// full reports whether b has refilled to the burst by now: it is then the same as no bucket.
func (b *bucket) full(now time.Time, r catalog.Rates) bool {
	return b.tokens+now.Sub(b.at).Seconds()*r.PerSecond >= float64(r.Burst)
}

// keyBuckets holds the buckets of the keys seen lately.
type keyBuckets struct {
	rate    catalog.Rates
	mu      sync.Mutex
	buckets map[string]*bucket
	swept   time.Time
}

func newKeyBuckets(r catalog.Rates) *keyBuckets {
	return &keyBuckets{rate: r, buckets: map[string]*bucket{}}
}

// sweepEvery is how often buckets that refilled are forgotten, which bounds the map by the keys
// active in the last minute or so.
const sweepEvery = time.Minute

// take spends a token of key's bucket at now.
func (k *keyBuckets) take(key string, now time.Time) (bool, time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Sub(k.swept) >= sweepEvery {
		for id, b := range k.buckets {
			if b.full(now, k.rate) {
				delete(k.buckets, id)
			}
		}
		k.swept = now
	}
	b, ok := k.buckets[key]
	if !ok {
		b = &bucket{tokens: float64(k.rate.Burst), at: now}
		k.buckets[key] = b
	}
	return b.take(now, k.rate)
}

// limitRate refuses a request of a key whose bucket is empty: 429 rate_limited, with Retry-After
// in whole seconds until the bucket holds a token again.
func (s *Server) limitRate(next echo.HandlerFunc) echo.HandlerFunc {
	if s.catalog.Rates.PerSecond <= 0 {
		return next
	}
	return func(c echo.Context) error {
		ok, wait := s.rates.take(principal(c).KeyID, time.Now())
		if !ok {
			secs := max(1, int(math.Ceil(wait.Seconds())))
			c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
			return apierr.New(apierr.RateLimited, "this API key sent more than %g requests a second (burst %d); retry after %d s",
				s.catalog.Rates.PerSecond, s.catalog.Rates.Burst, secs)
		}
		return next(c)
	}
}
