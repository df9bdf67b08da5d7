package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// ticks are the cron ticks a node has run or is running, by tick id, kept until a while after
// their deadline: a node runs a tick id at most once (SPEC 3.6), and the Host may ask again for
// one whose answer it lost.
type ticks struct {
	mu   sync.Mutex
	runs map[string]*tickRun
}

type tickRun struct {
	forget  time.Time
	done    chan struct{}
	outcome adminapi.ScheduledOutcome
}

// tickMemory is how long after its deadline a tick id is remembered: the Host asks no more once
// the deadline passed, and the node refuses a late ask anyway.
const tickMemory = 10 * time.Minute

// maxTickDeadline bounds how long a tick id is remembered before its tickMemory starts, whatever
// its deadline says (the Host's deadline is 60 s after the tick, by the database's clock, which
// need not be the node's): the tick ids a node remembers stay bounded.
const maxTickDeadline = 10 * time.Minute

// start is the run of tick id and whether the caller is the one to run it.
func (t *ticks) start(id string, deadline time.Time) (*tickRun, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := time.Now()
	if t.runs == nil {
		t.runs = map[string]*tickRun{}
	}
	if r, ok := t.runs[id]; ok {
		return r, false
	}
	for k, r := range t.runs {
		if now.After(r.forget) {
			delete(t.runs, k)
		}
	}
	if latest := now.Add(maxTickDeadline); deadline.After(latest) {
		deadline = latest
	}
	r := &tickRun{forget: deadline.Add(tickMemory), done: make(chan struct{})}
	t.runs[id] = r
	return r, true
}

// dialing is a client whose every connection goes to addr (an org process's ingress socket,
// "unix:<path>" or host:port), one connection per request: ticks are rare.
func dialing(addr string) *http.Client {
	network, address := "tcp", addr
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, address = "unix", path
	}
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, address)
		},
		DisableKeepAlives: true,
	}}
}

// runScheduled runs one cron tick of a script's worker (SPEC 3.6): once per tick id, only before
// its deadline, on the script's current Ready incarnation; the outcome enters the worker's log
// beside what the handler printed.
func (n *Node) runScheduled(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.ScheduledRun
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := checkID("tickId", req.TickID); err != nil {
		return nil, err
	}
	if req.Cron == "" || len(req.Cron) > 128 || strings.ContainsFunc(req.Cron, func(c rune) bool { return c < 0x20 || c == 0x7f }) {
		return nil, invalid("cron must be 1 to 128 characters without control characters")
	}
	if !time.Now().Before(req.Deadline) {
		return nil, adminapi.NewProblem(http.StatusConflict, adminapi.CodeTickExpired, "Tick expired", "the tick's deadline passed; it is not run")
	}
	n.mu.RLock()
	cur := n.desired.Scripts[name]
	if cur == nil || cur.WorkerUID != req.WorkerUID {
		n.mu.RUnlock()
		return nil, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeScriptAbsent, "Not Found", "script "+name+" is not here for that worker UID")
	}
	target, found := n.servingLocked(name)
	n.mu.RUnlock()
	if found != edge.Found {
		return nil, adminapi.NewProblem(http.StatusServiceUnavailable, adminapi.CodeNotReady, "Script not ready", "script "+name+" has no Ready incarnation to run the tick")
	}
	run, first := n.ticks.start(req.TickID, req.Deadline)
	if !first {
		select {
		case <-run.done:
			return run.outcome, nil
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
	run.outcome = n.scheduled(target, req)
	close(run.done)
	n.mu.Lock()
	ring := n.logRingLocked(req.WorkerUID)
	n.mu.Unlock()
	if ring.Admit() {
		line := fmt.Sprintf("scheduled %q at %s: %s", req.Cron, req.ScheduledTime.UTC().Format(time.RFC3339), run.outcome.Outcome)
		if run.outcome.Message != "" {
			line += ": " + run.outcome.Message
		}
		ring.Append(incarnationOf(run.outcome.Incarnation), adminapi.LevelInfo, line)
	}
	n.log.Info("cron tick run", "script", name, "cron", req.Cron, "tickId", req.TickID, "outcome", run.outcome.Outcome)
	return run.outcome, nil
}

// incarnationOf is the incarnation a loader id ("<incarnation>.<attempt>") loads.
func incarnationOf(loader string) string {
	if i := strings.LastIndexByte(loader, '.'); i > 0 {
		return loader[:i]
	}
	return loader
}

// scheduled asks target's router to run the tick, counted as one request in flight of the
// incarnation (its liveness and its subrequest budget, as any request), bounded by the worker's
// own wall limit or the edge's response timeout.
func (n *Node) scheduled(target edge.Target, req adminapi.ScheduledRun) adminapi.ScheduledOutcome {
	out := adminapi.ScheduledOutcome{Outcome: adminapi.ScheduledException, Incarnation: incarnationOf(target.Incarnation())}
	flight, ok := target.Acquire()
	if !ok {
		out.Message = "the incarnation was retired before the tick ran"
		return out
	}
	defer flight.Done()
	limit := n.cfg.Edge.ResponseTimeout
	if wl, ok := target.(edge.WallLimited); ok && wl.WallLimit() > 0 && (limit <= 0 || wl.WallLimit() < limit) {
		limit = wl.WallLimit()
	}
	if limit <= 0 {
		limit = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://router.takoform.invalid/", nil)
	if err != nil {
		out.Message = err.Error()
		return out
	}
	hreq.Header.Set(workerd.HeaderIncarnation, target.Incarnation())
	hreq.Header.Set(workerd.HeaderScheduled, req.Cron)
	hreq.Header.Set(workerd.HeaderScheduledTime, strconv.FormatInt(req.ScheduledTime.UnixMilli(), 10))
	resp, err := dialing(target.Addr()).Do(hreq)
	if err != nil {
		out.Message = "the worker's process did not answer: " + err.Error()
		if ctx.Err() != nil {
			out.Message = fmt.Sprintf("the scheduled handler did not end within %s", limit)
		}
		return out
	}
	defer resp.Body.Close()
	flight.Answered()
	var answer struct {
		Outcome string `json:"outcome"`
		Message string `json:"message"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &answer) != nil {
		out.Message = fmt.Sprintf("the worker's process answered %d", resp.StatusCode)
		return out
	}
	if answer.Outcome == adminapi.ScheduledOK {
		out.Outcome = adminapi.ScheduledOK
		return out
	}
	// The exception's text may hold what the worker was given: it reaches the worker's log
	// through its tail, scrubbed there, and never the Host.
	out.Message = "the scheduled handler threw; the worker's log has the exception"
	return out
}
