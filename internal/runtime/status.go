package runtime

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sort"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

func incarnationStatus(x *running) *adminapi.Incarnation {
	if x == nil {
		return nil
	}
	st := x.inc.Status()
	if st.Address != "" {
		st.Address = "unix:" + st.Address
	}
	return &adminapi.Incarnation{
		ID: x.id, DeploymentID: x.deploymentID, Generation: x.generation, DeliveryID: x.deliveryID,
		State: st.State, Reason: st.Reason, Message: st.Message, Restarts: st.Restarts, Incident: st.Incident,
		Address: st.Address, Loader: st.Loader, PID: st.PID,
	}
}

// scriptStatusLocked reports one script (n.mu held, read or write), with its version: a digest of
// the rest, so that any change to what it says changes it.
func (n *Node) scriptStatusLocked(name string) adminapi.ScriptStatus {
	out := n.scriptStateLocked(name)
	b, err := json.Marshal(out)
	if err != nil {
		panic(err) // plain strings, numbers and booleans
	}
	sum := sha256.Sum256(b)
	out.Version = hex.EncodeToString(sum[:8])
	return out
}

func (n *Node) scriptStateLocked(name string) adminapi.ScriptStatus {
	s := n.desired.Scripts[name]
	if s == nil {
		return adminapi.ScriptStatus{ScriptName: name, SecretNames: []string{}, Secrets: adminapi.SecretsStatus{Names: []string{}}}
	}
	out := adminapi.ScriptStatus{
		ScriptName: name, Present: true, WorkerUID: s.WorkerUID, DeploymentID: s.DeploymentID, Generation: s.Generation,
		BundleDigest: s.BundleDigest, Labels: s.Labels, SecretNames: append([]string{}, s.SecretNames...),
		Secrets: adminapi.SecretsStatus{Names: []string{}},
	}
	if d := s.Delivery; d != nil {
		out.Secrets = adminapi.SecretsStatus{Delivered: true, Names: append([]string{}, d.Names...), DeliveryID: d.DeliveryID}
	}
	r := n.scripts[name]
	if r == nil {
		out.Reason = adminapi.ReasonPending
		return out
	}
	switch {
	case r.serving != nil:
		out.Incarnation = incarnationStatus(r.serving)
		out.Candidate = incarnationStatus(r.candidate)
		if out.Candidate == nil {
			out.Candidate = incarnationStatus(r.failed)
		}
	case r.candidate != nil:
		out.Incarnation = incarnationStatus(r.candidate)
	default:
		out.Incarnation = incarnationStatus(r.failed)
	}
	want, err := n.wantLocked(r, s, false)
	current := err == nil && r.serving != nil && r.serving.id == want.id && r.serving.inc.Ready()
	secretsCurrent := len(s.SecretNames) == 0 ||
		(secretsCover(s) && r.serving != nil && r.serving.deliveryID == s.Delivery.DeliveryID)
	out.Ready = current && secretsCurrent
	switch {
	case out.Ready:
		out.Reason = adminapi.ReasonReady
	case r.problem != "":
		out.Reason = adminapi.ReasonFailed
		if out.Incarnation == nil {
			out.Incarnation = &adminapi.Incarnation{State: adminapi.StateFailed, Reason: adminapi.ReasonFailed, Message: r.problem}
		}
	case current:
		out.Reason = adminapi.ReasonSecretsPending
	case out.Candidate != nil && out.Candidate.State == adminapi.StateFailed:
		out.Reason = adminapi.ReasonFailed
	case r.candidate != nil && r.serving != nil && r.candidate.inc.Ready() && !secretsCover(s):
		out.Reason = adminapi.ReasonSecretsPending
	case r.candidate != nil && r.serving != nil:
		out.Reason = adminapi.ReasonPending
	case out.Incarnation != nil:
		out.Reason = out.Incarnation.Reason
	default:
		out.Reason = adminapi.ReasonPending
	}
	if r.serving != nil {
		st := r.serving.inc.Status()
		if st.Incident {
			out.Incident, out.IncidentMessage = true, st.IncidentMessage
		}
		if st.Quarantined {
			out.Quarantined, out.QuarantineMessage = true, st.QuarantineMessage
		}
	}
	return out
}

// secretsCover reports whether the script's delivery carries exactly the secrets it declares.
func secretsCover(s *state.Script) bool {
	return len(s.SecretNames) == 0 || (s.Delivery != nil && sameNames(s.Delivery.Names, s.SecretNames))
}

func sameNames(a, b []string) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	sort.Strings(x)
	sort.Strings(y)
	return slices.Equal(x, y)
}

// routeStatusLocked reports one route (n.mu held).
func (n *Node) routeStatusLocked(hostname string) adminapi.RouteStatus {
	route := n.desired.Routes[hostname]
	if route == nil {
		return adminapi.RouteStatus{Hostname: hostname}
	}
	out := adminapi.RouteStatus{Hostname: hostname, Present: true, ScriptName: route.ScriptName, EndpointUID: route.EndpointUID, DeploymentID: route.DeploymentID}
	if r := n.scripts[route.ScriptName]; r != nil && n.desired.Scripts[route.ScriptName] != nil && r.serving != nil {
		out.Ready = r.serving.inc.Ready()
	}
	return out
}

// waitLocked is what a status long poll of script waits on (n.mu held, for reading or writing):
// it is closed by the next signal of that script. Taken under the same hold of n.mu as the status
// the poll read, it misses no change. The poll says doneWaiting when it stops waiting.
func (n *Node) waitLocked(script string) <-chan struct{} {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	w := n.waits[script]
	if w == nil {
		w = &waiters{ch: make(chan struct{})}
		n.waits[script] = w
	}
	w.n++
	return w.ch
}

// doneWaiting ends one long poll's wait on ch: a script's channel is kept only while polls wait on
// it, so names polled once (an absent script's, say) leave nothing behind.
func (n *Node) doneWaiting(script string, ch <-chan struct{}) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	if w := n.waits[script]; w != nil && w.ch == ch {
		if w.n--; w.n == 0 {
			delete(n.waits, script)
		}
	}
}

// waiters is one script's status long polls: the channel they wait on and how many do.
type waiters struct {
	ch chan struct{}
	n  int
}

// signalLocked wakes the status long polls of the scripts named, or of every script when none is
// (n.mu held for writing).
func (n *Node) signalLocked(scripts ...string) {
	n.waitMu.Lock()
	defer n.waitMu.Unlock()
	if len(scripts) == 0 {
		for name, w := range n.waits {
			close(w.ch)
			delete(n.waits, name)
		}
		return
	}
	for _, name := range scripts {
		if w := n.waits[name]; w != nil {
			close(w.ch)
			delete(n.waits, name)
		}
	}
}
