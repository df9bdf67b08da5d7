package workerlog

import (
	"sync"
	"time"
)

// The rate of one organization's output lines on a node, across all its processes and workers.
const (
	OutputLinesPerSecond = 100
	OutputLineBurst      = 200
)

// Budget is the output lines one tenant's workers may have the runtime read together (SPEC 5.1: a
// tenant's log lines are rate-limited, however many workers it runs): a token bucket of
// OutputLinesPerSecond with a burst of OutputLineBurst. A line is taken from it before it is
// parsed, so that a flood costs the runtime no parsing. The zero value is full and ready to use.
type Budget struct {
	// Now is the clock (tests move it); nil is time.Now.
	Now func() time.Time

	mu     sync.Mutex
	tokens float64
	last   time.Time
}

// Take takes one line, reporting false when the bucket is empty.
func (b *Budget) Take() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.Now != nil {
		now = b.Now()
	}
	if b.last.IsZero() {
		b.tokens = OutputLineBurst
	} else if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens = min(OutputLineBurst, b.tokens+elapsed*OutputLinesPerSecond)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}
