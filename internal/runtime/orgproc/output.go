package orgproc

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// output reads one start of a process's workerd output. A worker's console.* lines come to the
// runtime attributed through its tail (logTail); what workerd prints of them here, unattributed,
// is dropped. workerd's own lines are logged, scrubbed of every value any incarnation of the
// process holds, within the organization's line budget (taken before a line is parsed), and the
// last of them are kept to explain a failed start.
type output struct {
	p    *Process
	mu   sync.Mutex
	buf  []byte
	tail []string
	// skipping: the current line was over long and is dropped up to its end.
	skipping bool
	dropped  int
	report   *time.Timer
}

func newOutput(p *Process) *output { return &output{p: p} }

// maxOutputLine bounds one line of workerd's output kept in memory.
const maxOutputLine = 64 << 10

// tailLines is how many of workerd's own last lines are kept for diagnostics.
const tailLines = 20

func (o *output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.buf = append(o.buf, b...)
	for {
		n := bytes.IndexByte(o.buf, '\n')
		if n < 0 {
			break
		}
		if !o.skipping {
			o.line(o.buf[:n])
		}
		o.skipping = false
		o.buf = o.buf[n+1:]
	}
	if len(o.buf) > maxOutputLine || (o.skipping && len(o.buf) > 0) {
		// Cutting the line could split a value between two pieces that are each scrubbed
		// clean: an over-long line is dropped to its end instead, never logged in part.
		o.skipping = true
		o.buf = o.buf[:0]
	}
	return len(b), nil
}

// line handles one line (o.mu held).
func (o *output) line(raw []byte) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return
	}
	if bytes.HasPrefix(raw, []byte("{")) && !bytes.Contains(raw, []byte(`"source":"`)) {
		// A console.* call of a worker, which its tail carries attributed (and charges to its
		// organization's budget there): dropped here unparsed. Inside a JSON string a quote is
		// escaped, so only workerd's own lines hold that key.
		return
	}
	budget := o.p.lines()
	if budget != nil && !budget.Take() {
		o.dropped++
		if o.report == nil {
			o.report = time.AfterFunc(time.Second, o.reportDropped)
		}
		return
	}
	parsed := workerlog.Parse(string(raw))
	if parsed.Structured && parsed.Worker && parsed.Level != adminapi.LevelException {
		return // a console.* line: the worker's tail has it, attributed
	}
	text := o.p.scrubber.Load().Apply(parsed.Message)
	o.p.log.Info("workerd output", "line", text)
	for _, piece := range strings.Split(text, "\n") {
		if strings.TrimSpace(piece) != "" {
			o.tail = append(o.tail, piece)
			if len(o.tail) > tailLines {
				o.tail = o.tail[1:]
			}
		}
	}
}

// reportDropped logs how many lines the budget dropped since the last summary.
func (o *output) reportDropped() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.report = nil
	if o.dropped > 0 {
		o.p.log.Warn("workerd output lines dropped: over the organization's line budget", "dropped", o.dropped,
			"limit", "100 lines/s, burst 200")
		o.dropped = 0
	}
}

// Tail is the last lines kept, scrubbed.
func (o *output) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.tail, "\n")
}

// notable marks a line of workerd's output that says what went wrong.
var notable = regexp.MustCompile(`(?i)uncaught|error|exception|failed|not found|no such`)

// Diagnosis picks from the kept output the lines that explain a failed start: each notable line
// with the "at file:line" lines after it, at most four; else the last line.
func (o *output) Diagnosis() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var picked []string
	for n := 0; n < len(o.tail) && len(picked) < 4; n++ {
		if !notable.MatchString(o.tail[n]) {
			continue
		}
		picked = append(picked, strings.TrimSpace(o.tail[n]))
		for n+1 < len(o.tail) && len(picked) < 4 && strings.HasPrefix(strings.TrimSpace(o.tail[n+1]), "at ") {
			n++
			picked = append(picked, strings.TrimSpace(o.tail[n]))
		}
	}
	if len(picked) == 0 && len(o.tail) > 0 {
		picked = []string{strings.TrimSpace(o.tail[len(o.tail)-1])}
	}
	out := strings.Join(picked, " / ")
	if len(out) > 600 {
		out = out[:600] + "…"
	}
	return out
}

// lines is the organization's line budget (every incarnation of a process shares its
// organization's): the first one placed in it brought it.
func (p *Process) lines() *workerlog.Budget { return p.budget.Load() }

// tailEvent is what a tail delivers of one event of an isolate: its console.* calls and the
// exceptions it did not catch.
type tailEvent struct {
	Logs []struct {
		Level   string            `json:"level"`
		Message []json.RawMessage `json:"message"`
	} `json:"logs"`
	Exceptions []struct {
		Name    string `json:"name"`
		Message string `json:"message"`
		Stack   string `json:"stack"`
	} `json:"exceptions"`
}

var consoleLevels = map[string]string{
	"log": adminapi.LevelLog, "info": adminapi.LevelInfo, "warn": adminapi.LevelWarn,
	"error": adminapi.LevelError, "debug": adminapi.LevelDebug,
}

// countLines counts the console.* calls and exceptions of a tail delivery without decoding it:
// inside a JSON string a quote is escaped, so these keys appear unescaped only as the events'
// own.
func countLines(body []byte) int {
	return max(1, bytes.Count(body, []byte(`"level":"`))+bytes.Count(body, []byte(`"stack":`)))
}

// logTail enters the lines of one tail delivery into the worker's log: one line was taken from
// the organization's budget already, each further one takes its own; each is scrubbed of the
// incarnation's values before it enters the ring, which applies the worker's own rate limit.
func logTail(inc *Incarnation, body []byte) {
	var events []tailEvent
	if err := json.Unmarshal(body, &events); err != nil {
		return
	}
	first := true
	take := func() bool {
		if first {
			first = false
			return true
		}
		return inc.spec.Lines.Take()
	}
	lines := 0
	for _, e := range events {
		lines += len(e.Logs) + len(e.Exceptions)
	}
	entered := 0
	add := func(level, message string) bool {
		if !take() {
			inc.spec.Log.Drop(lines - entered)
			return false
		}
		entered++
		if inc.spec.Log.Admit() {
			inc.spec.Log.Append(inc.spec.ID, level, inc.spec.Scrub.Apply(inc.spec.Places.Apply(message)))
		}
		return true
	}
	for _, e := range events {
		for _, l := range e.Logs {
			level := consoleLevels[l.Level]
			if level == "" {
				level = adminapi.LevelLog
			}
			if !add(level, consoleText(l.Message)) {
				return
			}
		}
		for _, x := range e.Exceptions {
			text := "Uncaught " + x.Name + ": " + x.Message
			if x.Stack != "" {
				text += "\n" + x.Stack
			}
			if !add(adminapi.LevelException, text) {
				return
			}
		}
	}
}

// consoleText is one console.* call's arguments as console prints them: strings as they are,
// anything else as JSON, separated by spaces.
func consoleText(args []json.RawMessage) string {
	parts := make([]string, 0, len(args))
	for _, a := range args {
		var s string
		if err := json.Unmarshal(a, &s); err == nil {
			parts = append(parts, s)
		} else {
			parts = append(parts, string(a))
		}
	}
	return strings.Join(parts, " ")
}
