package cfstandin

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"
)

// FaultKind is what an injected fault does to the request it meets.
type FaultKind string

// The faults a test can inject.
const (
	// FaultServerError answers Status (default 500) with Cloudflare's internal error, without
	// applying the request.
	FaultServerError FaultKind = "server_error"
	// FaultRateLimited answers 429 with Retry-After (RetryAfter, default 1 s) and code 971,
	// without applying the request. It does not start the 5-minute block (Block does).
	FaultRateLimited FaultKind = "rate_limited"
	// FaultLostAnswer applies the request, then drops the connection without answering: the
	// change was made and the caller cannot know it.
	FaultLostAnswer FaultKind = "lost_answer"
	// FaultSlow waits Delay before handling the request (or until the caller gives up).
	FaultSlow FaultKind = "slow"
	// FaultHold reads the request, then holds it until Release is called, and applies it then
	// whether or not its caller is still there: a request Cloudflare works on after the Host
	// that sent it stopped (its upload lands late). Held counts the requests held now.
	FaultHold FaultKind = "hold"
)

// Fault is an injected fault for the next Times requests (default 1) that match Method (empty:
// any) and whose path under /client/v4 contains PathContains (empty: any).
type Fault struct {
	Kind         FaultKind     `json:"kind"`
	Method       string        `json:"method,omitempty"`
	PathContains string        `json:"pathContains,omitempty"`
	Times        int           `json:"times,omitempty"`
	Status       int           `json:"status,omitempty"`
	RetryAfter   time.Duration `json:"retryAfter,omitempty"`
	Delay        time.Duration `json:"delay,omitempty"`
}

func (f Fault) validate() error {
	switch f.Kind {
	case FaultServerError:
		if f.Status != 0 && (f.Status < 500 || f.Status > 599) {
			return fmt.Errorf("a server_error fault needs a 5xx status, not %d", f.Status)
		}
	case FaultRateLimited, FaultLostAnswer, FaultSlow, FaultHold:
	default:
		return fmt.Errorf("unknown fault kind %q (server_error, rate_limited, lost_answer, slow, hold)", f.Kind)
	}
	if f.Times < 0 {
		return fmt.Errorf("times must not be negative")
	}
	return nil
}

// Inject arms a fault.
func (s *Server) Inject(f Fault) error {
	if err := f.validate(); err != nil {
		return err
	}
	if f.Times == 0 {
		f.Times = 1
	}
	if f.Kind == FaultHold {
		s.holdGate(true)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, &f)
	return nil
}

// Release lets every request a FaultHold holds go on (and those it will hold until the next
// Inject of a FaultHold pass at once).
func (s *Server) Release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released == nil {
		s.released = make(chan struct{})
	}
	select {
	case <-s.released:
	default:
		close(s.released)
	}
}

// Held is how many requests a FaultHold holds now.
func (s *Server) Held() int64 { return s.held.Load() }

// holdGate is the channel a held request waits on (made on first use; a FaultHold armed after a
// Release waits for the next Release).
func (s *Server) holdGate(arm bool) chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.released == nil {
		s.released = make(chan struct{})
	}
	if arm {
		select {
		case <-s.released:
			s.released = make(chan struct{})
		default:
		}
	}
	return s.released
}

// ClearFaults disarms every fault not yet met.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = nil
}

// takeFault returns the first armed fault matching the request and counts it as met.
func (s *Server) takeFault(method, path string) *Fault {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, f := range s.faults {
		if (f.Method == "" || strings.EqualFold(f.Method, method)) && strings.Contains(path, f.PathContains) {
			met := *f
			f.Times--
			if f.Times <= 0 {
				s.faults = append(s.faults[:i:i], s.faults[i+1:]...)
			}
			return &met
		}
	}
	return nil
}

// rateState is the token's request log for Cloudflare's sliding rate limit, and its block.
type rateState struct {
	times        []time.Time
	blockedUntil time.Time
}

// admit counts one request of the token and reports whether it may proceed; when it may not, it
// returns the seconds until the block ends. Once the limit is passed, every call is refused for
// RateBlock.
func (s *Server) admit() (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Before(s.rate.blockedUntil) {
		return false, retrySeconds(s.rate.blockedUntil.Sub(now))
	}
	horizon := now.Add(-s.cfg.RateWindow)
	keep := 0
	for keep < len(s.rate.times) && !s.rate.times[keep].After(horizon) {
		keep++
	}
	s.rate.times = append(s.rate.times[:0], s.rate.times[keep:]...)
	if len(s.rate.times) >= s.cfg.RateLimit {
		s.rate.blockedUntil = now.Add(s.cfg.RateBlock)
		s.rate.times = s.rate.times[:0]
		return false, retrySeconds(s.cfg.RateBlock)
	}
	s.rate.times = append(s.rate.times, now)
	return true, 0
}

// Block starts the rate-limit block now, for d (default RateBlock), as if the limit had been
// passed.
func (s *Server) Block(d time.Duration) {
	if d == 0 {
		d = s.cfg.RateBlock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rate.blockedUntil = s.now().Add(d)
}

func retrySeconds(d time.Duration) int {
	return int(math.Max(1, math.Ceil(d.Seconds())))
}

func rateLimited(retryAfter int) *failure {
	f := fail(http.StatusTooManyRequests, CodeRateLimited, "Please wait and consider throttling your request speed")
	f.retryAfter = retryAfter
	return f
}
