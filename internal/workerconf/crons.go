package workerconf

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// MaxCrons bounds a worker's cron triggers (SPEC 3.6).
const MaxCrons = 16

// standard parses the five fields of a cron expression (minute, hour, day of month, month, day of
// week), in UTC, without descriptors (@hourly) or seconds.
var standard = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)

// Schedule is a parsed cron expression: Next is its first tick after t, in UTC.
type Schedule struct{ s cron.Schedule }

// Next is the schedule's first tick strictly after t (zero when it has none within five years).
func (s Schedule) Next(t time.Time) time.Time { return s.s.Next(t.UTC()) }

// ParseCron parses a standard five-field cron expression, read in UTC.
func ParseCron(expr string) (Schedule, error) {
	if len(strings.Fields(expr)) != 5 || strings.TrimSpace(expr) != expr || strings.Contains(expr, "  ") {
		return Schedule{}, fmt.Errorf("cron %q must be five fields (minute hour day-of-month month day-of-week) separated by single spaces, read in UTC", expr)
	}
	s, err := standard.Parse(expr)
	if err != nil {
		return Schedule{}, fmt.Errorf("cron %q: %v", expr, err)
	}
	if s.Next(time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)).IsZero() {
		return Schedule{}, fmt.Errorf("cron %q never fires", expr)
	}
	return Schedule{s}, nil
}

// checkCrons checks a worker's crons: at most MaxCrons, each a standard five-field expression.
func checkCrons(crons []string) error {
	if len(crons) > MaxCrons {
		return fmt.Errorf("crons holds %d triggers; at most %d", len(crons), MaxCrons)
	}
	for _, c := range crons {
		if _, err := ParseCron(c); err != nil {
			return err
		}
	}
	return nil
}
