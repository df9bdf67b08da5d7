package orgproc

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// callGrace is how long past its time limit a call run in the process stays counted when the
// router never reports its end (it always does, unless its process is failing).
const callGrace = 5 * time.Second

// calls are the service binding calls the node admitted and the process runs itself, from
// caller isolate to callee isolate (SPEC 5): the router reports each one's end by its number.
// Until then each holds what the edge counts for it (the callee's flight, the loop count, the
// caller's subrequest).
type calls struct {
	mu   sync.Mutex
	next uint64
	held map[uint64]*heldCall
}

type heldCall struct {
	end   func(answered bool)
	timer *time.Timer
}

// hold counts a call until it ends, or until limit and a grace pass (then unanswered).
func (c *calls) hold(limit time.Duration, end func(answered bool)) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil {
		c.held = map[uint64]*heldCall{}
	}
	c.next++
	id := c.next
	c.held[id] = &heldCall{end: end, timer: time.AfterFunc(limit+callGrace, func() { c.end(id, false) })}
	return id
}

// end ends call id (a number never held, or already ended, is nothing).
func (c *calls) end(id uint64, answered bool) {
	c.mu.Lock()
	h := c.held[id]
	delete(c.held, id)
	c.mu.Unlock()
	if h != nil {
		h.timer.Stop()
		h.end(answered)
	}
}

// ended ends the calls a report lists: "<number>:<1 if answered, else 0>", separated by commas
// (what does not parse is nothing).
func (c *calls) ended(report string) {
	for item := range strings.SplitSeq(report, ",") {
		num, answered, _ := strings.Cut(item, ":")
		if id, err := strconv.ParseUint(num, 10, 64); err == nil {
			c.end(id, answered == "1")
		}
	}
}

// endAll ends every call, unanswered: their process ended under them.
func (c *calls) endAll() {
	c.mu.Lock()
	held := c.held
	c.held = nil
	c.mu.Unlock()
	for _, h := range held {
		h.timer.Stop()
		h.end(false)
	}
}

// local runs in this process the binding calls whose callee it holds: it names the callee's
// loader id to the router, which calls that isolate itself and reports the end under the call's
// number (with its next admission, or a moment later). A callee in another process (one running alone) is the edge's to carry: the router is
// told to send the call whole.
func (p *Process) local(w http.ResponseWriter, target edge.Target, limit time.Duration, end func(answered bool)) bool {
	callee, ok := target.(*unit)
	if !ok || callee.p != p {
		// The edge withdraws the callee's flight: no answer of the callee's process, which
		// liveness would take for one (a looping callee that is called kept looking busy).
		w.Header().Set(workerd.HeaderElsewhere, "1")
		w.WriteHeader(http.StatusNoContent)
		return false
	}
	id := p.calls.hold(limit, end)
	w.Header().Set(workerd.HeaderCallee, callee.loaderID)
	w.Header().Set(workerd.HeaderCall, strconv.FormatUint(id, 10))
	w.Header().Set(workerd.HeaderDeadline, strconv.FormatInt(limit.Milliseconds(), 10))
	w.WriteHeader(http.StatusNoContent)
	return true
}
