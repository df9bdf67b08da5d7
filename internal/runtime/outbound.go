package runtime

import (
	"net/http"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/edge"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
)

// Resolve implements edge.Resolver: the serving incarnation of the hostname's route, when Ready.
func (n *Node) Resolve(hostname string) (edge.Target, int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	route := n.desired.Routes[hostname]
	if route == nil {
		return nil, edge.UnknownHost
	}
	return n.servingLocked(route.ScriptName)
}

// servingLocked is the serving incarnation of a script, when Ready (n.mu held).
func (n *Node) servingLocked(name string) (edge.Target, int) {
	r := n.scripts[name]
	if n.desired.Scripts[name] == nil || r == nil || r.serving == nil {
		return nil, edge.NotReady
	}
	t := r.serving.inc.Target()
	if t == nil {
		return nil, edge.NotReady
	}
	return t, edge.Found
}

// serveBinding serves a call a worker made through its service binding: one more subrequest of
// the caller (its meter admits it), routed through the edge (its limits, loop count and
// accounting) to the current Ready incarnation of the worker the binding names, never straight to
// a socket. With local, the edge only admits it and local runs it in the caller's process; the
// subrequest stays counted until the call ends there.
func (n *Node) serveBinding(w http.ResponseWriter, r *http.Request, from *orgproc.Incarnation, binding string, local edge.Local) {
	caller := from.Script()
	w, r, release, ok := from.Meter().Hold(w, r)
	if !ok {
		return
	}
	lookup := func() (edge.Target, int) { return n.resolveBinding(caller, from.Org(), from.Callee(binding)) }
	if local == nil {
		defer release()
		n.edgeHandler.ServeBinding(w, r, caller, lookup, nil)
		return
	}
	// Admitted, the call is the caller's process's to run: the subrequest is released when it ends
	// there. Refused before (no callee, a loop), or handed back, it is released here.
	handed := false
	n.edgeHandler.ServeBinding(w, r, caller, lookup, func(w http.ResponseWriter, t edge.Target, limit time.Duration, end func(bool)) bool {
		// Handed back to be carried whole (false), the call is the edge's again, and the
		// subrequest is released here.
		handed = local(w, t, limit, func(answered bool) { end(answered); release() })
		return handed
	})
	if !handed {
		release()
	}
}

// resolveBinding finds the callee a binding of the caller script names, by the worker UID the
// calling incarnation binds it to (each incarnation resolves with its own map: the one serving
// keeps its bindings while a newer deployment starts or is held): the script of that worker UID,
// of the caller's organization (the Host allows no other; the node checks again), and that
// script's serving incarnation when Ready.
func (n *Node) resolveBinding(caller, org, callee string) (edge.Target, int) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	s := n.desired.Scripts[caller]
	if s == nil || callee == "" || s.Labels.Organization != org {
		return nil, edge.UnknownHost
	}
	name, ok := n.byUID[callee]
	c := n.desired.Scripts[name]
	if !ok || c == nil || c.WorkerUID != callee || c.Labels.Organization != org {
		return nil, edge.UnknownHost
	}
	return n.servingLocked(name)
}
