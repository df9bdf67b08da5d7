package runtime

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// maxLogPage bounds the entries of one log page.
const maxLogPage = 500

// getLogs answers a page of a worker's log ring (adminapi: Worker logs): the entries after the
// caller's cursor, or, with wait, the first ones to arrive within it. Only the worker UID that
// holds the script reads it.
func (n *Node) getLogs(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	uid := q.Get(adminapi.QueryWorkerUID)
	if uid == "" {
		return nil, invalid("the read names the worker UID it means: ?workerUid=")
	}
	epoch := q.Get("epoch")
	var after uint64
	if v := q.Get("after"); v != "" {
		if after, err = strconv.ParseUint(v, 10, 64); err != nil {
			return nil, invalid("after must be an entry's sequence number")
		}
	}
	var since time.Time
	if v := q.Get("since"); v != "" {
		if since, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return nil, invalid("since must be an RFC 3339 time")
		}
	}
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return nil, invalid("wait must be a duration such as 25s")
		}
		wait = min(wait, adminapi.LogWaitMax)
	}
	n.mu.Lock()
	cur := n.desired.Scripts[name]
	if cur == nil || cur.WorkerUID != uid {
		n.mu.Unlock()
		return nil, adminapi.NewProblem(http.StatusNotFound, adminapi.CodeScriptAbsent, "Not Found", "script "+name+" is not here for that worker UID")
	}
	ring := n.logRingLocked(uid)
	n.mu.Unlock()
	if wait > 0 {
		// One long poll more, within the bound: the connections it holds are the Host's too.
		if n.logWaits.Add(1) > adminapi.MaxLogWaits {
			n.logWaits.Add(-1)
			return nil, adminapi.NewProblem(http.StatusTooManyRequests, adminapi.CodeLogWaitsFull, "Too many requests",
				fmt.Sprintf("this node already holds %d log long polls; retry shortly", adminapi.MaxLogWaits))
		}
		defer n.logWaits.Add(-1)
	}

	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		page, changed := ring.Read(epoch, after, since, maxLogPage)
		if len(page.Entries) > 0 || page.Missed > 0 || wait <= 0 {
			return page, nil
		}
		// Entries before since moved the cursor: wait on from there.
		epoch, after = page.Epoch, page.Next
		if !n.awaitChange(r, changed, timer) || !n.holds(name, uid) {
			return page, nil // its wait is over, or its worker left (the ring was closed)
		}
	}
}

// awaitChange holds a long poll until changed is closed (true), or until it should answer as it
// is (false): its wait has passed, its caller has gone or the node is closing.
func (n *Node) awaitChange(r *http.Request, changed <-chan struct{}, timer *time.Timer) bool {
	select {
	case <-changed:
		return true
	case <-timer.C:
	case <-r.Context().Done():
	case <-n.quitting:
	}
	return false
}

// holds reports whether the node still desires script name for worker UID uid.
func (n *Node) holds(name, uid string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	cur := n.desired.Scripts[name]
	return cur != nil && cur.WorkerUID == uid
}
