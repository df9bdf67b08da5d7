package sandbox

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultUIDRange is where organizations' uids come from unless the node is told otherwise: far
// above the accounts of a usual machine and below the ranges container runtimes map by default.
var DefaultUIDRange = UIDRange{First: 200000, Last: 299999}

// UIDRange is the inclusive range of uids the node gives organizations, one each (SPEC 5.1). It
// is a pflag.Value, so a command line can set it as FIRST-LAST.
type UIDRange struct {
	First, Last int
}

// ParseUIDRange reads FIRST-LAST.
func ParseUIDRange(s string) (UIDRange, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		return UIDRange{}, fmt.Errorf("uid range %q is not FIRST-LAST", s)
	}
	first, err1 := strconv.Atoi(lo)
	last, err2 := strconv.Atoi(hi)
	if err1 != nil || err2 != nil {
		return UIDRange{}, fmt.Errorf("uid range %q is not FIRST-LAST", s)
	}
	r := UIDRange{First: first, Last: last}
	return r, r.Validate()
}

// Validate refuses a range that holds root or cannot be a uid.
func (r UIDRange) Validate() error {
	switch {
	case r.First <= 0:
		return fmt.Errorf("uid range %s holds root or negative uids: it must start above 0", r)
	case r.Last < r.First:
		return fmt.Errorf("uid range %s ends before it starts", r)
	case r.Last >= 1<<32-1:
		return fmt.Errorf("uid range %s goes past the largest uid", r)
	}
	return nil
}

// String writes FIRST-LAST.
func (r UIDRange) String() string { return fmt.Sprintf("%d-%d", r.First, r.Last) }

// Set implements pflag.Value.
func (r *UIDRange) Set(s string) error {
	v, err := ParseUIDRange(s)
	if err != nil {
		return err
	}
	*r = v
	return nil
}

// Type implements pflag.Value.
func (r *UIDRange) Type() string { return "first-last" }

// Contains reports whether uid is in the range.
func (r UIDRange) Contains(uid int) bool { return uid >= r.First && uid <= r.Last }

// ErrUIDsExhausted means every uid of the range is held or taken.
var ErrUIDsExhausted = errors.New("every uid of the sandbox uid range is held by an organization or taken by an account of this machine")

// AllocateUID picks the uid for a new organization: the lowest of r that no organization holds,
// that is neither root nor the node's own uid (SPEC 5.1: an organization's user owns nothing
// else), and that taken does not report (an account of this machine). Each organization keeps its
// uid for as long as the node's state lives, so a uid is never handed to a second organization.
func AllocateUID(r UIDRange, held map[string]int, own int, taken func(uid int) bool) (int, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	inUse := make(map[int]bool, len(held))
	for _, uid := range held {
		inUse[uid] = true
	}
	for uid := r.First; uid <= r.Last; uid++ {
		if uid == 0 || uid == own || inUse[uid] || (taken != nil && taken(uid)) {
			continue
		}
		return uid, nil
	}
	return 0, ErrUIDsExhausted
}
