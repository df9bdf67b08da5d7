package runtime

// ScriptWork is what one script has cost this node so far: the reconciles of it, and the
// renders of its desired identity (a workerd config and the digests of its bundle). A test reads
// it to check that other tenants' churn and status reads cost a script nothing.
func (n *Node) ScriptWork(name string) (reconciles int, renders int64) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	r := n.scripts[name]
	if r == nil {
		return 0, 0
	}
	return r.reconciles, r.renders.Load()
}

// StatusWakes is how many times a status long poll was woken to read its script's status again.
func (n *Node) StatusWakes() int64 { return n.statusWakes.Load() }

// LogPollsWaiting is how many log long polls are waiting for an entry.
func (n *Node) LogPollsWaiting() int64 { return n.logWaits.Load() }

// PollsWaiting is how many scripts have status long polls waiting on them.
func (n *Node) PollsWaiting() int {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	return len(n.waits)
}

// InFlight is the number of requests in flight to a script's serving incarnation.
func (n *Node) InFlight(name string) int64 {
	n.mu.RLock()
	defer n.mu.RUnlock()
	if r := n.scripts[name]; r != nil && r.serving != nil {
		return r.serving.inc.InFlight()
	}
	return 0
}

// Stopping is the number of a script's incarnations retired and not yet out of their process.
func (n *Node) Stopping(name string) int {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return len(n.stopping[name])
}

// CodeHeld reports whether the node holds a script's code in memory, its desired content's or
// its incumbent's (it should not once the code is saved: it reads it from its store on demand).
func (n *Node) CodeHeld(name string) bool {
	n.mu.RLock()
	defer n.mu.RUnlock()
	s := n.desired.Scripts[name]
	if s == nil {
		return false
	}
	return s.Modules.Held() || (s.Serving != nil && s.Serving.Modules.Held())
}
