package desired

import "fmt"

// Refusal is why Apply refused an operation: a stable code of the admin API (adminapi.Code*) and a
// detail that names no other worker or organization.
type Refusal struct {
	Code   string
	Detail string
	// Shows is the current status the refusal may carry, so the caller can see what is there:
	// ShowsNothing where the holder may be another organization's.
	Shows Subject
}

func (r *Refusal) Error() string { return r.Code + ": " + r.Detail }

// Subject is what a refusal's current status describes.
type Subject int

// Subjects a refusal can show.
const (
	ShowsNothing Subject = iota
	ShowsScript
	ShowsRoute
)

func refusal(code string, shows Subject, format string, args ...any) *Refusal {
	return &Refusal{Code: code, Detail: fmt.Sprintf(format, args...), Shows: shows}
}
