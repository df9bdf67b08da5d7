// Package workerlog keeps what a worker printed: a bounded in-memory ring of its console.* lines
// and uncaught exceptions, per worker UID, read by the admin API's log route (and through it the
// Host's GET …/workers/{name}/logs). The supervisor parses workerd's structured output (Parse),
// scrubs each message of the worker's secret values, and only then appends it here: no secret
// ever enters a ring. Appends pass a per-worker rate limit; what it refuses is counted, and the
// count enters the ring as an entry of its own.
package workerlog

import (
	"crypto/rand"
	"encoding/hex"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// Bounds of one worker's ring and rate limit.
const (
	// MaxEntries and MaxBytes bound a ring: the oldest entries leave first.
	MaxEntries = 1000
	MaxBytes   = 256 << 10
	// MaxMessage bounds one entry's message (longer ones are cut, after scrubbing).
	MaxMessage = 16 << 10
	// LinesPerSecond and LineBurst are the per-worker token bucket of entries.
	LinesPerSecond = 50
	LineBurst      = 100
	// DroppedAfter is how long after the first refused line its count enters the ring, when no
	// admitted line has carried it in before.
	DroppedAfter = time.Second
)

// truncatedMark ends a message cut at MaxMessage.
const truncatedMark = "…[truncated]"

// Ring is one worker's log. The zero value is not usable: use New.
type Ring struct {
	// now is the clock (tests move it).
	now func() time.Time

	mu      sync.Mutex
	epoch   string
	entries []adminapi.LogEntry
	bytes   int
	next    uint64 // the sequence number of the next entry
	changed chan struct{}

	tokens  float64
	last    time.Time
	dropped int
	report  *time.Timer
}

// New returns an empty ring with a fresh epoch.
func New() *Ring { return NewWithClock(time.Now) }

// NewWithClock is New with a clock of the caller's.
func NewWithClock(now func() time.Time) *Ring {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return &Ring{now: now, epoch: hex.EncodeToString(b), next: 1, changed: make(chan struct{})}
}

// Epoch names this ring: a cursor is only meaningful within one epoch.
func (r *Ring) Epoch() string { return r.epoch }

// Admit takes one line from the worker's bucket. A refused line is counted; its count enters
// the ring with the next admitted line, or DroppedAfter later.
func (r *Ring) Admit() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.last.IsZero() {
		r.tokens = LineBurst
	} else if elapsed := now.Sub(r.last).Seconds(); elapsed > 0 {
		r.tokens = min(LineBurst, r.tokens+elapsed*LinesPerSecond)
	}
	r.last = now
	if r.tokens >= 1 {
		r.tokens--
		return true
	}
	r.dropped++
	if r.report == nil {
		r.report = time.AfterFunc(DroppedAfter, r.flushDropped)
	}
	return false
}

// Drop counts n lines refused before they reached the ring (its organization's output budget was
// spent): their count enters the ring as Admit's refusals do.
func (r *Ring) Drop(n int) {
	if n <= 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropped += n
	if r.report == nil {
		r.report = time.AfterFunc(DroppedAfter, r.flushDropped)
	}
}

// Append adds one admitted line. message must already be scrubbed; it is cut at MaxMessage.
func (r *Ring) Append(incarnation, level, message string) {
	if len(message) > MaxMessage {
		cut := MaxMessage
		for cut > 0 && !utf8.RuneStart(message[cut]) {
			cut--
		}
		message = message[:cut] + truncatedMark
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.appendDroppedLocked()
	r.appendLocked(adminapi.LogEntry{Time: r.now().UTC(), Incarnation: incarnation, Level: level, Message: message})
}

func (r *Ring) flushDropped() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.report = nil
	r.appendDroppedLocked()
}

// appendDroppedLocked moves the count of refused lines into the ring (r.mu held).
func (r *Ring) appendDroppedLocked() {
	if r.dropped == 0 {
		return
	}
	r.appendLocked(adminapi.LogEntry{Time: r.now().UTC(), Dropped: r.dropped})
	r.dropped = 0
}

func (r *Ring) appendLocked(e adminapi.LogEntry) {
	e.Seq = r.next
	r.next++
	r.entries = append(r.entries, e)
	r.bytes += size(e)
	drop := 0
	for len(r.entries)-drop > MaxEntries || (r.bytes > MaxBytes && len(r.entries)-drop > 1) {
		r.bytes -= size(r.entries[drop])
		drop++
	}
	if drop > 0 {
		// Copy down rather than reslice, so the array does not keep evicted messages alive.
		r.entries = append(r.entries[:0], r.entries[drop:]...)
	}
	close(r.changed)
	r.changed = make(chan struct{})
}

func size(e adminapi.LogEntry) int { return 64 + len(e.Incarnation) + len(e.Level) + len(e.Message) }

// Read answers the entries after the cursor (epoch, after), received at or after since (when not
// zero), at most max of them (all when max <= 0). A cursor of another epoch reads from the start.
// Missed counts the entries that left the ring between a cursor of this epoch and the first entry
// still held. changed is closed when an entry is appended after this read.
func (r *Ring) Read(epoch string, after uint64, since time.Time, max int) (page adminapi.LogPage, changed <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if epoch != r.epoch {
		after = 0
	}
	page = adminapi.LogPage{Epoch: r.epoch, Next: after, Entries: []adminapi.LogEntry{}}
	if after > 0 && len(r.entries) > 0 && r.entries[0].Seq > after+1 {
		page.Missed = int(r.entries[0].Seq - after - 1)
	}
	full := false
	for _, e := range r.entries {
		if e.Seq <= after {
			continue
		}
		if max > 0 && len(page.Entries) >= max {
			full = true
			break
		}
		page.Next = e.Seq
		if !since.IsZero() && e.Time.Before(since) {
			continue
		}
		page.Entries = append(page.Entries, e)
	}
	if !full && r.next-1 > page.Next {
		page.Next = r.next - 1
	}
	return page, r.changed
}

// Close stops the dropped-count timer and wakes the long polls waiting on the ring.
func (r *Ring) Close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.report != nil {
		r.report.Stop()
		r.report = nil
	}
	// Long polls waiting on it answer now: its worker is gone, and nothing more will come.
	close(r.changed)
	r.changed = make(chan struct{})
}
