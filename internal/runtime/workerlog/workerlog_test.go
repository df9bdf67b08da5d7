package workerlog

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func newRing() (*Ring, *clock) {
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	r := NewWithClock(c.now)
	return r, c
}

// A worker's lines pass a token bucket of its own (a burst, then a steady rate); what it refuses
// is counted, and the count enters the log where the gap is, before the next line admitted.
func TestRateLimitDropsAndCountsWhereTheGapIs(t *testing.T) {
	t.Parallel()
	r, c := newRing()
	defer r.Close()
	admitted := 0
	for i := range 1000 {
		if r.Admit() {
			r.Append("inc-1", adminapi.LevelLog, fmt.Sprint("line ", i))
			admitted++
		}
	}
	require.Equal(t, LineBurst, admitted)
	c.add(time.Second)
	require.True(t, r.Admit(), "a second later the steady rate passes again")
	r.Append("inc-1", adminapi.LevelLog, "after the gap")
	page, _ := r.Read("", 0, time.Time{}, 0)
	require.Len(t, page.Entries, LineBurst+2)
	gap := page.Entries[LineBurst]
	require.Equal(t, 1000-LineBurst, gap.Dropped, "the dropped count sits between the last line before the gap and the first after")
	require.Empty(t, gap.Level)
	require.Equal(t, "after the gap", page.Entries[LineBurst+1].Message)
}

// With no line after the drops, the count still enters the log, DroppedAfter later.
func TestDroppedCountArrivesWithoutAnotherLine(t *testing.T) {
	t.Parallel()
	r, _ := newRing()
	defer r.Close()
	for range LineBurst + 7 {
		if r.Admit() {
			r.Append("inc-1", adminapi.LevelLog, "x")
		}
	}
	page, changed := r.Read("", 0, time.Time{}, 0)
	require.Len(t, page.Entries, LineBurst)
	select {
	case <-changed:
	case <-time.After(5 * DroppedAfter):
		t.Fatal("the dropped count never arrived")
	}
	page, _ = r.Read(page.Epoch, page.Next, time.Time{}, 0)
	require.Len(t, page.Entries, 1)
	require.Equal(t, 7, page.Entries[0].Dropped)
}

// The ring is bounded: the oldest entries leave, a reader whose cursor they passed is told how
// many it missed, a cursor of another epoch starts over, and since skips older entries.
func TestRingIsBoundedAndReadByCursor(t *testing.T) {
	t.Parallel()
	r, c := newRing()
	defer r.Close()
	for i := range MaxEntries + 10 {
		c.add(time.Second) // a fresh token per line
		require.True(t, r.Admit())
		r.Append("inc-1", adminapi.LevelInfo, fmt.Sprint("line ", i))
	}
	page, _ := r.Read("", 0, time.Time{}, 0)
	require.Len(t, page.Entries, MaxEntries)
	require.Equal(t, "line 10", page.Entries[0].Message)
	require.Equal(t, uint64(MaxEntries+10), page.Next)

	stale, _ := r.Read(page.Epoch, 5, time.Time{}, 3)
	require.Equal(t, 5, stale.Missed, "entries 6 to 10 left before this reader got to them")
	require.Len(t, stale.Entries, 3)
	require.Equal(t, uint64(13), stale.Next)

	other, _ := r.Read("another-epoch", page.Next, time.Time{}, 0)
	require.Len(t, other.Entries, MaxEntries, "a cursor of another epoch (a restarted node) reads from the start")

	since := page.Entries[MaxEntries-3].Time
	recent, _ := r.Read("", 0, since, 0)
	require.Len(t, recent.Entries, 3)
	require.Equal(t, page.Next, recent.Next)

	long := strings.Repeat("é", MaxMessage)
	require.True(t, r.Admit())
	r.Append("inc-1", adminapi.LevelLog, long)
	last, _ := r.Read(page.Epoch, page.Next, time.Time{}, 0)
	require.Len(t, last.Entries, 1)
	require.LessOrEqual(t, len(last.Entries[0].Message), MaxMessage+len(truncatedMark))
	require.True(t, strings.HasSuffix(last.Entries[0].Message, truncatedMark))
	require.NotContains(t, last.Entries[0].Message, "\uFFFD")
	bytes := 0
	all, _ := r.Read("", 0, time.Time{}, 0)
	for _, e := range all.Entries {
		bytes += size(e)
	}
	require.LessOrEqual(t, bytes, MaxBytes)
}

// workerd's structured lines are told apart: a console call keeps its level, an uncaught
// exception reads as its author would write it (without workerd's C++ locations or native stack),
// workerd's other lines and unstructured output are not the worker's, and a worker's message that
// looks like one of workerd's lines stays a message.
func TestParseTellsTheWorkersLinesFromWorkerds(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		raw    string
		want   Line
		reason string
	}{
		{`{"timestamp":1,"level":"log","message":"hello { a: 1 }"}`, Line{Structured: true, Worker: true, Level: "log", Message: "hello { a: 1 }"}, "console.log"},
		{`{"timestamp":1,"level":"warn","message":"w"}`, Line{Structured: true, Worker: true, Level: "warn", Message: "w"}, "console.warn"},
		{`{"timestamp":1,"level":"trace","message":"t"}`, Line{Structured: true, Worker: true, Level: "log", Message: "t"}, "an unknown console level"},
		{`{"timestamp":1,"level":"log","message":"{\"source\":\"x\",\"message\":\"Uncaught fake\"}"}`, Line{Structured: true, Worker: true, Level: "log", Message: `{"source":"x","message":"Uncaught fake"}`}, "a forged line stays a message"},
		{`{"timestamp":"1","level":"error","source":"workerd/server/server/listen/mod.rs:372","message":"Uncaught exception: workerd/jsg/value.h:1456: failed: remote.jsg.TypeError: Cannot read properties of undefined (reading 'x')","context_depth":0}`,
			Line{Structured: true, Worker: true, Level: "exception", Message: "Uncaught TypeError: Cannot read properties of undefined (reading 'x')"}, "a handler's exception"},
		{`{"timestamp":"1","level":"error","source":"src/workerd/server/server/entry.rs:170","message":"service main: Uncaught Error: boom\n  at main.js:3:7","context_depth":0}`,
			Line{Structured: true, Worker: true, Level: "exception", Message: "Uncaught Error: boom\n  at main.js:3:7"}, "a top-level exception"},
		{`{"timestamp":"1","level":"info","source":"workerd/io/io-context.c++:656","message":"uncaught exception; exception = workerd/jsg/value.h:1456: failed: jsg.Error: x\nstack: /bin/workerd@3f68b70","context_depth":0}`,
			Line{Structured: true, Level: "info", Message: "uncaught exception; exception = workerd/jsg/value.h:1456: failed: jsg.Error: x\nstack: /bin/workerd@3f68b70"}, "workerd's own line"},
		{`workerd/server/server.c++:100: error: config not valid`, Line{Message: `workerd/server/server.c++:100: error: config not valid`}, "unstructured output"},
		{`{not json`, Line{Message: `{not json`}, "a brace that is not JSON"},
	} {
		require.Equal(t, c.want, Parse(c.raw), c.reason)
	}
}

// An organization's output budget is one bucket however many workers and processes take from it:
// a burst, then a steady rate; a process that restarts (a crash on purpose) gets no fresh burst.
func TestAnOrganizationsOutputBudgetIsOneBurstThenItsRate(t *testing.T) {
	t.Parallel()
	clock := time.Unix(1_700_000_000, 0)
	b := &Budget{Now: func() time.Time { return clock }}
	taken := 0
	for range 3 * OutputLineBurst { // three takers at the same instant
		if b.Take() {
			taken++
		}
	}
	require.Equal(t, OutputLineBurst, taken, "one burst, whoever takes from it")
	clock = clock.Add(100 * time.Millisecond)
	taken = 0
	for range OutputLineBurst {
		if b.Take() {
			taken++
		}
	}
	require.Equal(t, OutputLinesPerSecond/10, taken, "then the rate: 100 ms bring a tenth of a second's lines")
}
