package workerlog

import (
	"encoding/json"
	"regexp"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// Line is one line of workerd's output, understood.
//
// The runtime renders every config with structured logging on (logging.structuredLogging), so
// workerd prints one JSON object per line: a console.* call is {"timestamp", "level", "message"};
// workerd's own lines also name their "source" (a C++ or Rust file), and among them an exception a
// worker did not catch reads "Uncaught …". A worker controls only the text of its messages, which
// workerd escapes inside "message": it cannot print a line that reads as another kind.
type Line struct {
	// Structured: the line was one of workerd's JSON objects, and Message is its decoded text.
	Structured bool
	// Worker: the line is the worker's own (a console.* call or an uncaught exception); Level says
	// which.
	Worker  bool
	Level   string
	Message string
}

type structured struct {
	Level   *string `json:"level"`
	Message *string `json:"message"`
	Source  *string `json:"source"`
}

var consoleLevels = map[string]string{
	"log": adminapi.LevelLog, "info": adminapi.LevelInfo, "warn": adminapi.LevelWarn,
	"error": adminapi.LevelError, "debug": adminapi.LevelDebug,
}

// Parse reads one line of workerd's output. A line that is not a structured object (workerd's
// output before it has read its config) is returned as it is, not the worker's.
func Parse(raw string) Line {
	if !strings.HasPrefix(raw, "{") {
		return Line{Message: raw}
	}
	var s structured
	if err := json.Unmarshal([]byte(raw), &s); err != nil || s.Level == nil || s.Message == nil {
		return Line{Message: raw}
	}
	out := Line{Structured: true, Message: *s.Message, Level: *s.Level}
	if s.Source == nil {
		out.Worker = true
		if out.Level = consoleLevels[*s.Level]; out.Level == "" {
			out.Level = adminapi.LevelLog
		}
		return out
	}
	if strings.Contains(out.Message, "Uncaught") {
		out.Worker, out.Level, out.Message = true, adminapi.LevelException, exceptionText(out.Message)
	}
	return out
}

var (
	// servicePrefix is how workerd names the service whose script threw at its top level; the
	// service name is the runtime's, not the worker's.
	servicePrefix = regexp.MustCompile(`^service [^:\n]+: `)
	// kjPrefix is the C++ location and wrapping workerd puts before an exception thrown in a
	// handler ("Uncaught exception: workerd/jsg/value.h:1456: failed: remote.jsg.TypeError: …").
	kjPrefix = regexp.MustCompile(`^Uncaught exception: (?:\S+:\d+: failed: )?(?:remote\.)?(?:jsg\.)?`)
)

// exceptionText is an uncaught exception as the worker's author would write it ("Uncaught
// TypeError: …", then its stack when workerd gives one), without workerd's internals: its C++
// locations, and any native stack it appends.
func exceptionText(m string) string {
	if i := strings.Index(m, "\nstack: "); i >= 0 {
		m = m[:i]
	}
	m = servicePrefix.ReplaceAllString(m, "")
	return kjPrefix.ReplaceAllString(m, "Uncaught ")
}
