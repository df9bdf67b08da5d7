package runtime

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
)

// applyLocked decides op on the desired state (n.mu held for writing), persists the state it
// returns (so memory never runs ahead of disk), then performs the side effects its answer asks for.
// A refusal is a problem carrying, where the refusal allows it, the current status of subject (the
// script name or hostname of the request). seal, when the answer asks for it, puts the operation's
// values at rest before the state names them. The incarnations the reconcile retired finish
// stopping in the background; the caller may wait for them.
func (n *Node) applyLocked(op desired.Op, subject string, seal func() error) (desired.Answer, []Incarnation, error) {
	next, a := desired.Apply(*n.desired, op)
	if a.Refused != nil {
		return a, nil, n.refusalLocked(a.Refused, subject)
	}
	if !a.Changed {
		return a, nil, nil
	}
	if a.Seal {
		if err := seal(); err != nil {
			return a, nil, err
		}
	}
	if err := n.store.Save(&next); err != nil {
		return a, nil, fmt.Errorf("persist desired state: %w", err)
	}
	n.desired = &next
	if a.Reconcile != "" {
		// Only a script's own changes move its status (routes, brakes and the rest are not in it;
		// what a brake does to an incarnation kicks its script when it happens).
		defer n.signalLocked(a.Reconcile)
	}
	n.eraseSecrets(a.Erase)
	if a.DropLog != "" {
		n.dropLogRingLocked(a.DropLog)
	}
	if run := n.scripts[a.Reconcile]; a.RetryFailed && run != nil {
		run.failed, run.unstartable = nil, "" // a new effect asks again for a candidate that failed
	}
	var retired []Incarnation
	if a.Reconcile != "" {
		retired = n.reconcileLocked(a.Reconcile)
	}
	if a.WakeAll {
		n.procs.WakeAll()
	}
	return a, retired, nil
}

// refusalLocked is the problem answering a refusal: the one place its codes meet HTTP statuses.
func (n *Node) refusalLocked(r *desired.Refusal, subject string) error {
	status, title := http.StatusConflict, "Conflict"
	switch r.Code {
	case adminapi.CodeScriptHeld:
		title = "Script held"
	case adminapi.CodeDeliveryRefused:
		title = "Delivery refused"
	case adminapi.CodeWorkerMismatch:
		title = "Worker mismatch"
	case adminapi.CodeScriptAbsent:
		status, title = http.StatusNotFound, "Not Found"
	case adminapi.CodeSecretNames:
		status, title = http.StatusUnprocessableEntity, "Secret names mismatch"
	}
	p := adminapi.NewProblem(status, r.Code, title, r.Detail)
	switch r.Shows {
	case desired.ShowsScript:
		p.Current = n.scriptStatusLocked(subject)
	case desired.ShowsRoute:
		p.Current = n.routeStatusLocked(subject)
	}
	return p
}

// effect names one request's effect for Apply: its id, the keyed digest of its body, and now.
func (n *Node) effect(id string, body any) desired.Effect {
	b, _ := json.Marshal(body)
	return desired.Effect{ID: id, RequestMAC: n.store.MAC(b), PreviousMAC: n.store.PreviousMAC(b), At: time.Now().UTC()}
}

func replayed(w http.ResponseWriter) { w.Header().Set(adminapi.HeaderReplayed, "true") }

func (n *Node) eraseSecrets(workerUID string) {
	if workerUID == "" {
		return
	}
	if err := n.store.EraseSecrets(workerUID); err != nil {
		n.log.Error("erase delivered secrets", "workerUid", workerUID, "error", err)
	}
}
