package orgproc

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// maxUnavailable is how many times a probe is tried under new loader ids when the runtime could
// not give the code (a reason of the node's, not the code's).
const maxUnavailable = 3

// probe loads u's incarnation in the process and calls its probe entrypoint (SPEC 5): "ready"
// is the second witness; a load that fails fails the incarnation with workerd's own message. A
// probe cut short by its process's death is left to died, which knows whether it was to blame.
func (p *Process) probe(u *unit) {
	select {
	case p.probes <- struct{}{}:
	case <-p.stop:
		return
	}
	defer func() { <-p.probes }()
	if !u.probing.Load() || u.retired.Load() {
		return
	}
	inc := u.inc
	ctx, cancel := context.WithTimeout(context.Background(), p.m.opts.ProbeDeadline)
	defer cancel()
	go func() {
		select {
		case <-p.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	res, err := p.askProbe(ctx, u.loaderID)
	if u.retired.Load() {
		return
	}
	switch {
	case err != nil:
		if ctx.Err() == context.DeadlineExceeded && p.state().phase == phaseRunning {
			p.failProbe(u, fmt.Sprintf("no probe answered within %s", p.m.opts.ProbeDeadline))
		}
		// Otherwise its process died or stopped meanwhile: died decides.
		return
	case res.Outcome == "ready":
		u.loaded.Store(true)
		u.probed.Store(true)
		u.probing.Store(false)
		inc.refresh()
		p.m.opts.Changed(inc)
	case res.Outcome == "unavailable":
		u.loaded.Store(true)
		if u.attempt >= maxUnavailable {
			p.failProbe(u, "the runtime node could not give its code to its process")
			return
		}
		time.Sleep(100 * time.Millisecond)
		if nu := p.reattempt(u); nu != nil {
			p.probe(nu)
		}
	default:
		u.loaded.Store(true)
		msg := inc.spec.Scrub.Apply(inc.spec.Places.Apply(res.Message))
		if l := inc.spec.Log; l != nil && l.Admit() {
			l.Append(inc.spec.ID, adminapi.LevelException, msg)
		}
		p.failProbe(u, "workerd could not load it: "+msg)
	}
}

// failProbe fails a candidate whose probe failed; a served incarnation (probed again in a
// recycled process) keeps serving, and reloads on demand there.
func (p *Process) failProbe(u *unit, why string) {
	u.probing.Store(false)
	if u.inc.isAdmitted() {
		u.inc.log.Warn("a served incarnation failed its probe in a new process; it reloads on demand", "reason", why)
		return
	}
	u.inc.fail(why)
}

// askProbe sends one probe over the ingress socket.
func (p *Process) askProbe(ctx context.Context, loaderID string) (workerd.ProbeOutcome, error) {
	var out workerd.ProbeOutcome
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://router.takoform.invalid/", nil)
	if err != nil {
		return out, err
	}
	req.Header.Set(workerd.HeaderProbe, loaderID)
	resp, err := p.client.Do(req)
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return out, err
	}
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("the router answered a probe %d", resp.StatusCode)
	}
	return out, json.Unmarshal(b, &out)
}

// reattempt replaces u with a unit of the next attempt number (a new loader id, which workerd
// has no failure cached under), and reports it; nil when u left meanwhile.
func (p *Process) reattempt(u *unit) *unit {
	p.mu.Lock()
	if p.live[u.inc] != u || p.stopping {
		p.mu.Unlock()
		return nil
	}
	nu := &unit{p: p, inc: u.inc, attempt: u.attempt + 1, open: map[*flight]struct{}{}}
	nu.loaderID = loaderID(u.inc.spec.ID, nu.attempt)
	nu.probing.Store(true)
	p.units[nu.loaderID] = nu
	p.live[u.inc] = nu
	p.mu.Unlock()
	u.retired.Store(true)
	u.probing.Store(false)
	u.inc.addUnit(nu, u.inc.cur.CompareAndSwap(u, nu))
	u.inc.dropUnit(u)
	return nu
}

// died answers one end of workerd that the runtime did not ask for: every incarnation in the
// process counts a restart; those implicated (SPEC 5.1) answer for it; a served one a worker
// brake covers stays down after the restart.
func (p *Process) died(out outcome, backoff time.Duration) {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	var everyone []*unit
	var candidates []candidate
	for _, u := range p.live {
		everyone = append(everyone, u)
		if !out.ran {
			continue // it never ran: nothing of a tenant's did either
		}
		// A request that ended unanswered since the process last answered a probe counts as in
		// flight at its end: its connection may break before the runtime sees the process go
		// (which waits for its cgroup to empty).
		c := u.candidate(p.alive.Load())
		c.loading, c.subrequests = u.probing.Load(), out.subrequests[u.inc]
		candidates = append(candidates, c)
	}
	implicated := blame(candidates, out.killed, p.lastAnswer.Load())
	if out.ran {
		p.failedStarts = 0
	} else {
		p.failedStarts++
	}
	failedStarts := p.failedStarts
	reason := out.reason
	if reason == "" {
		reason = adminapi.ReasonRestarting
	}
	p.st = procState{phase: phaseRestarting, reason: reason, message: fmt.Sprintf("%s; restarting in %s", out.why, backoff)}
	p.current = nil
	p.mu.Unlock()
	// Not Ready from now on, before anything else is decided.
	p.refreshAll()

	for _, u := range everyone {
		inc := u.inc
		inc.mu.Lock()
		inc.restarts++
		admitted := inc.admitted
		inc.mu.Unlock()
		p.m.opts.Restarted(inc)
		if admitted && p.m.opts.BrakedIncarnation(inc.spec.Labels) {
			u.held.Store(true)
		}
	}
	for _, c := range implicated {
		p.m.implicate(c.u, c.loading, out.why)
	}
	if failedStarts >= 3 {
		// A process that never runs fails the candidates waiting in it: none was to blame, but
		// none can be admitted either. Served incarnations wait for it for as long as it takes.
		for _, u := range everyone {
			if !u.inc.isAdmitted() {
				u.inc.fail(fmt.Sprintf("its organization's workerd never ran after %d starts: %s", failedStarts, out.why))
			}
		}
	}
	p.refreshAll()
}

// candidate is an incarnation of a process that ended: whether a load of it was in progress, its
// requests in flight at the end, and, at a liveness kill, its subrequests then in flight and
// those that had ended lately.
type candidate struct {
	u           *unit
	loading     bool
	flights     []begun
	subrequests []subrequest
	// ended are its last requests that ended, endedBefore the latest end of those it forgot (0:
	// none).
	ended       []span
	endedBefore int64
}

// subrequest is one of a worker's subrequests (a fetch, a call): when it began, when its body had
// been wholly sent (0: not yet), when its answer began to come back (0: not yet) and when it
// ended (0: in flight), mono.
type subrequest struct {
	began, sent, answered, ended int64
}

// never is a request's turn when it cannot have taken the thread: it waits for an answer of a
// subrequest that has not come.
const never = int64(math.MaxInt64)

// blame picks the incarnations a process's end implicates (SPEC 5.1), given when it last answered
// anything (a probe, or a response of its workers, as the runtime saw it; mono). A load or probe in
// progress implicates its incarnation. An abort (a crash, a ceiling, a kill from outside)
// implicates every request in flight.
//
// A liveness kill implicates the requests that could have taken the thread first after the last
// answer (their turn, turnsOf): those in flight across it, each of which may have taken it since
// (after a lazy load, a fetch, a request queued behind the last one answered); when there is none,
// the request that began first after the last answer: the thread was free when it began. The
// requests that came after it are not to blame: a sibling of a looping worker with steady traffic
// always has some, queued behind the loop, and was quarantined with the looper for them.
//
// A request waiting for its own subrequest sent before the last answer, whose answer has not
// come (a worker awaiting a slow upstream), cannot hold the thread: it is implicated only when no
// other request nor load can (a worker that fetched and then looped without awaiting). It was
// blamed for every loop of another worker of its organization while it waited, and the looper
// went free. A request whose answer
// began (a stream, a WebSocket: open for as long as its client stays) is judged as one waiting for
// its answer only from when its client sent something after both its worker's last bytes and the
// last answer (a WebSocket's message); otherwise it is implicated only when nothing else is, those
// waiting for subrequests included: an organization's WebSockets were in flight across every
// answer, and were blamed for every other worker's loop.
//
// The calls (binding calls, subrequests to the node) in flight that a worker of this process made
// are implicated only with it, and theirs in turn: the loop may be the callee's.
func blame(candidates []candidate, killed bool, lastAnswer int64) []candidate {
	// A call of a worker of this process is judged by its caller: the router reports an
	// in-process call's end late, so one that ended may still look in flight.
	here := map[string]bool{}
	calling := map[string]bool{}
	for _, c := range candidates {
		here[c.u.inc.spec.Script] = true
	}
	for _, c := range candidates {
		for _, f := range c.flights {
			calling[f.caller] = calling[f.caller] || here[f.caller]
		}
	}
	request := func(f begun) bool { return !here[f.caller] }
	// turns[i][j] is when flight j of candidate i could first have taken the thread after the
	// last answer (lastAnswer itself: in flight across it), never, or -1: not a request waiting.
	turns := make([][]int64, len(candidates))
	first, loading, waitsForSubrequest := never, false, false
	for i, c := range candidates {
		loading = loading || c.loading
		turns[i] = turnsOf(c, calling[c.u.inc.spec.Script], lastAnswer, request)
		for _, turn := range turns[i] {
			if turn >= 0 {
				first = min(first, turn)
			}
			waitsForSubrequest = waitsForSubrequest || turn == never
		}
	}
	// Nothing could have taken the thread but a request waiting for a subrequest, or one whose
	// answer began.
	quiet := first == never && !loading
	implicated := make([]bool, len(candidates))
	scripts := map[string]bool{}
	for i, c := range candidates {
		implicated[i] = c.loading || !killed && len(c.flights) > 0
		for j, f := range c.flights {
			switch turn := turns[i][j]; {
			case !killed || implicated[i] || !request(f):
			case turn == never:
				implicated[i] = quiet
			case turn >= 0:
				implicated[i] = turn == first
			default:
				implicated[i] = quiet && !waitsForSubrequest
			}
		}
		if implicated[i] {
			scripts[c.u.inc.spec.Script] = true
		}
	}
	// The calls of implicated requests, and theirs in turn.
	for grew := true; grew; {
		grew = false
		for i, c := range candidates {
			if !implicated[i] && slices.ContainsFunc(c.flights, func(f begun) bool { return scripts[f.caller] }) {
				implicated[i], grew = true, true
				scripts[c.u.inc.spec.Script] = true
			}
		}
	}
	var out []candidate
	for i, c := range candidates {
		if implicated[i] {
			out = append(out, c)
		}
	}
	return out
}

// turnsOf answers, for each of c's flights, when it could first have taken the thread after the
// last answer: for a request waiting for the thread (begun, f.waiting), lastAnswer when it was in
// flight across it, else when it began; -1 for any other flight; never for a request in flight
// across the last answer that waits for a subrequest of its own.
//
// The egress cannot tell which request sent a subrequest, so a subrequest is a request's only when
// it was the worker's one request in flight as the subrequest was sent (or ended less than
// waitUntilGrace before: its ctx.waitUntil work may send it). A request waits for its own when it
// sent one whole before the last answer (the process answered something since, so the request had
// let go of the thread) that has not been answered, and no subrequest it may have sent shows it
// ran since the last answer: one answered since (it may have gone on from the answer and looped),
// or whose body was made since or is still being made (its worker's code makes a streamed body; a
// request that sent a fetch it did not await and then looped looks the same as one awaiting it).
// None excuses while the worker has a call in flight into this process (calling): its callee's
// requests are judged with the caller's, and the loop may be the callee's.
func turnsOf(c candidate, calling bool, lastAnswer int64, request func(begun) bool) []int64 {
	turns := make([]int64, len(c.flights))
	for j, f := range c.flights {
		at, waiting := f.waiting(lastAnswer)
		switch {
		case !request(f) || !waiting:
			turns[j] = -1
		case at < lastAnswer:
			turns[j] = lastAnswer
		default:
			turns[j] = at
		}
	}
	if calling {
		return turns
	}
	// excused: the requests whose own subrequest, sent whole before the last answer (the process
	// answered something since, so the request had let go of the thread), was unanswered at the
	// kill; ran: those that may have run since the last answer, as a subrequest shows.
	excused, ran := map[int]bool{}, map[int]bool{}
	for _, s := range c.subrequests {
		// Its possible senders: the requests in flight as it began, still or among those ended
		// since (read after the kill, the requests it broke are among these).
		var senders []int
		possible := 0 // senders, with the ended requests no longer among the flights
		for j, f := range c.flights {
			if f.open && f.at <= s.began {
				senders = append(senders, j)
				possible++
			}
		}
		for _, e := range c.ended {
			if e.began <= s.began && s.began <= e.ended+waitUntilGrace {
				possible++
				if j := slices.IndexFunc(c.flights, func(f begun) bool { return !f.open && f.at == e.began }); j >= 0 {
					senders = append(senders, j)
				}
			}
		}
		// Answered since the last answer, or its body made since (sent since, or a streamed body
		// its worker's code was still making then), it shows that whichever request sent it may
		// have run since.
		if s.answered >= lastAnswer || s.sent >= lastAnswer || s.sent == 0 && (s.ended == 0 || s.ended >= lastAnswer) {
			for _, j := range senders {
				ran[j] = true
			}
			continue
		}
		if s.answered != 0 || s.ended != 0 {
			continue // answered before the last answer, its request went on; ended unanswered, its worker stopped waiting
		}
		// A subrequest sent when a request the unit forgot may have been in flight, or beside
		// another request, is no one's.
		if c.endedBefore != 0 && s.began <= c.endedBefore+waitUntilGrace || possible != 1 || len(senders) != 1 {
			continue
		}
		if turns[senders[0]] == lastAnswer {
			excused[senders[0]] = true
		}
	}
	for j := range excused {
		if !ran[j] {
			turns[j] = never
		}
	}
	return turns
}

// waitUntilGrace is how long after its request ended a subrequest may still be the request's
// (ctx.waitUntil work sends most at once).
const waitUntilGrace = int64(100 * time.Millisecond)

// implicate answers for one incarnation implicated in its process's kill or abort (SPEC 5.1): a
// candidate implicated while it loaded fails and is never loaded again; a served one implicated
// while it loaded, or twice within an hour, runs alone from now on.
func (m *Manager) implicate(u *unit, loading bool, why string) {
	inc := u.inc
	if loading && !inc.isAdmitted() {
		inc.fail("its code held or ended its organization's process while it loaded (" + why + "); it is not loaded again")
		return
	}
	alone, incident := inc.implicate(time.Now())
	alone = alone || loading
	inc.log.Warn("implicated in the end of its organization's process", "reason", why, "loading", loading, "quarantine", alone)
	if incident {
		inc.log.Error(fmt.Sprintf("incident: implicated in the end of its organization's process %d times within %s; restarts continue (takoform_runtime_incident)",
			IncidentImplications, IncidentWindow), "implications", IncidentImplications)
	}
	if alone {
		m.quarantine(inc, u)
	}
	m.record()
}

// quarantine moves inc out of its organization's shared process into one of its own, or, when
// the organization has MaxQuarantine of those already, leaves it answering 503 until one is free.
func (m *Manager) quarantine(inc *Incarnation, from *unit) {
	if from.p.key.alone != "" {
		if !inc.spec.Alone {
			inc.mu.Lock()
			inc.quarantined = true
			inc.mu.Unlock()
		}
		return // alone already: only it pays for its loops
	}
	m.mu.Lock()
	if m.closed || inc.retired.Load() {
		m.mu.Unlock()
		return
	}
	if m.quarantinesLocked(inc.spec.Org) >= MaxQuarantine {
		m.blocked[inc] = true
		m.mu.Unlock()
		inc.mu.Lock()
		inc.blocked = true
		inc.mu.Unlock()
		inc.log.Warn("quarantined, but its organization has no quarantine process left: it answers 503", "max", MaxQuarantine)
		inc.refresh()
		m.opts.Changed(inc)
		return
	}
	delete(m.blocked, inc)
	nu, err := m.placeLocked(procKey{org: inc.spec.Org, alone: inc.spec.ID}, inc, !inc.isAdmitted())
	m.mu.Unlock()
	if err != nil {
		inc.log.Error("start a quarantine process", "error", err)
		return
	}
	inc.mu.Lock()
	inc.quarantined, inc.blocked = true, false
	inc.mu.Unlock()
	inc.log.Warn("quarantined: it runs in a process of its own", "process", nu.p.name)
	from.p.retire(from)
	inc.refresh()
	m.opts.Changed(inc)
}

// unblock gives a freed quarantine slot of org to one of its incarnations waiting for one.
func (m *Manager) unblock(org string) {
	m.mu.Lock()
	var next *Incarnation
	for inc := range m.blocked {
		if inc.retired.Load() {
			delete(m.blocked, inc)
			continue
		}
		if inc.spec.Org == org && next == nil {
			next = inc
		}
	}
	m.mu.Unlock()
	if next != nil {
		if u := next.cur.Load(); u != nil {
			m.quarantine(next, u)
		}
	}
}

// releaseHeld lets the served incarnations held by a worker brake reload once it is released.
func (p *Process) releaseHeld() {
	for _, inc := range p.incarnations() {
		if u := inc.cur.Load(); u != nil && u.held.Load() && !p.m.opts.BrakedIncarnation(inc.spec.Labels) {
			u.held.Store(false)
			inc.refresh()
			p.m.opts.Changed(inc)
		}
	}
}

// recycleFloor is the fewest retired isolates that recycle a process for outnumbering its live
// ones: a small organization's few updates cost no process start.
const recycleFloor = 16

// maybeRecycle recycles the process when workerd holds too much it will never free (SPEC 5):
// retired isolates outnumbering the live ones, or more than RecycleRetiredBytes of them, or
// RecycleSecretsAfter since an isolate holding secrets retired.
func (p *Process) maybeRecycle() {
	o := p.m.opts
	p.mu.Lock()
	live := len(p.live)
	due := p.st.phase == phaseRunning && !p.recycling && !p.stopping && p.retiredLoaded > 0 && live > 0 &&
		((p.retiredLoaded > live && p.retiredLoaded >= recycleFloor) ||
			p.retiredBytes > o.RecycleRetiredBytes ||
			(!p.secretsRetiredAt.IsZero() && time.Since(p.secretsRetiredAt) >= o.RecycleSecretsAfter))
	if due {
		p.recycling = true
	} else if !p.secretsRetiredAt.IsZero() && !p.stopping {
		// Due later (or not running now): look again then.
		p.scheduleRecycleLocked(max(time.Until(p.secretsRetiredAt.Add(o.RecycleSecretsAfter)), time.Second))
	}
	p.mu.Unlock()
	if due {
		go p.m.recycle(p)
	}
}

// scheduleRecycleLocked looks at recycling again after d (p.mu held).
func (p *Process) scheduleRecycleLocked(d time.Duration) {
	if p.recycleTimer != nil {
		p.recycleTimer.Stop()
	}
	p.recycleTimer = time.AfterFunc(d, p.maybeRecycle)
}

// recycle replaces old with a fresh process (SPEC 5): the new one loads and probes old's live
// incarnations, the edge switches each to it, and old drains and stops. Incarnations placed
// meanwhile go to the new one. A new process that does not come up leaves old serving.
func (m *Manager) recycle(old *Process) {
	abort := func(why string, err error) {
		old.mu.Lock()
		old.recycling = false
		old.mu.Unlock()
		old.log.Warn("recycle abandoned: the process keeps serving", "why", why, "error", err)
	}
	m.mu.Lock()
	if m.closed || m.procs[old.key] != old {
		m.mu.Unlock()
		abort("the process is no longer its slot's", nil)
		return
	}
	m.gen++
	np, err := newProcess(m, old.key, m.gen, old.uid)
	if err != nil {
		m.mu.Unlock()
		abort("cannot prepare a new process", err)
		return
	}
	m.launchLocked(np)
	old.mu.Lock()
	type pair struct{ from, to *unit }
	var pairs []pair
	for _, u := range old.live {
		pairs = append(pairs, pair{from: u})
	}
	old.mu.Unlock()
	for i := range pairs {
		pairs[i].to, _ = np.place(pairs[i].from.inc, false, true)
	}
	m.mu.Unlock()
	old.log.Info("recycling the process", "into", np.name, "incarnations", len(pairs))

	deadline := time.Now().Add(m.opts.StartDeadline + m.opts.ProbeDeadline)
	for _, pr := range pairs {
		for pr.to != nil && pr.to.probing.Load() && !pr.to.retired.Load() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if np.state().phase != phaseRunning {
		m.mu.Lock()
		if m.procs[old.key] == np {
			m.procs[old.key] = old
		}
		m.mu.Unlock()
		np.shutdown()
		abort("the new process did not come up", nil)
		return
	}
	for _, pr := range pairs {
		inc := pr.from.inc
		if pr.to == nil {
			continue
		}
		if inc.retired.Load() || !inc.cur.CompareAndSwap(pr.from, pr.to) {
			np.retire(pr.to)
			continue
		}
		old.retire(pr.from)
		inc.refresh()
		m.opts.Changed(inc)
	}
	// Requests in flight in the old process finish there; then it stops.
	end := time.Now().Add(m.opts.DrainTimeout)
	for _, pr := range pairs {
		for pr.from.inflight.Load() > 0 && time.Now().Before(end) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	old.shutdown()
	old.log.Info("recycled", "into", np.name)
}
