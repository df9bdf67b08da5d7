package edge

import (
	"fmt"
	"testing"
	"time"
)

// An organization's first order in the hour is always allowed, however busy the machine: the
// limiter certmagic offers hands out its permits from a goroutine of its own, and a limiter made
// and asked at once refused now and then until that goroutine ran (a CI run saw another
// organization's hostname refused its first certificate). Its share is then spent, and an hour
// later it is there again.
func TestAnOrganizationsFirstOrderIsAllowedAndItsShareThenSpent(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 10, 0, 0, 0, time.UTC)
	l := newHourLimits(2, func() time.Time { return now })
	for i := range 2000 {
		if !l.allow(fmt.Sprintf("org-%d", i)) {
			t.Fatalf("org-%d's first order was refused", i)
		}
	}
	if !l.allow("org-0") {
		t.Fatal("org-0's second order of a share of two was refused")
	}
	if l.allow("org-0") {
		t.Fatal("org-0's third order of a share of two was allowed")
	}
	now = now.Add(time.Hour + time.Second)
	if !l.allow("org-0") {
		t.Fatal("an hour later org-0's share is not back")
	}
	if n := l.held(); n != 1 {
		t.Fatalf("the organizations with no order in the hour are kept: %d held", n)
	}
}
