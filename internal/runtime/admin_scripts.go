package runtime

import (
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/desired"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/orgproc"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
)

// putScript deploys a worker's generation under a script name (desired.PutScript) and answers the
// script's status; a replay answers it again, marked replayed.
func (n *Node) putScript(w http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	var req adminapi.ScriptPut
	if err := decode(r, &req); err != nil {
		return nil, err
	}
	if err := validateScript(req); err != nil {
		return nil, err
	}
	if err := n.checkMemory(req.Settings.LimitsOrZero().MemoryMB); err != nil {
		return nil, err
	}
	op := desired.PutScript{Effect: n.effect(req.EffectID, req), Script: state.Script{
		Name: name, WorkerUID: req.WorkerUID, DeploymentID: req.DeploymentID, Generation: req.Generation, Labels: req.Labels,
		Modules: state.NewCode(req.Modules), MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings.Normalize(),
		SecretNames: slices.Sorted(slices.Values(req.SecretNames)), BundleDigest: req.BundleDigest,
	}}
	n.mu.Lock()
	defer n.mu.Unlock()
	a, _, err := n.applyLocked(op, name, nil)
	if err != nil {
		return nil, err
	}
	if a.Replayed {
		replayed(w)
	} else {
		n.log.Info("script desired", "script", name, "workerUid", req.WorkerUID, "deploymentId", req.DeploymentID, "generation", req.Generation, "effectId", req.EffectID)
	}
	return n.scriptStatusLocked(name), nil
}

// checkMemory refuses a memory limit above the node's heap limit per isolate: every worker of a
// process runs with that one limit (SPEC 5.1), and the worker would run with less than it was
// promised.
func (n *Node) checkMemory(mb int64) error {
	if limit := int64(n.heapLimitMB()); mb > limit {
		return adminapi.NewProblem(http.StatusUnprocessableEntity, adminapi.CodeMemoryAboveNode, "Memory limit above the node's",
			fmt.Sprintf("limits.memoryMb %d is above this runtime node's %d MB per worker (V8's heap limit of each isolate)", mb, limit))
	}
	return nil
}

// heapLimitMB is V8's heap limit of each isolate on this node.
func (n *Node) heapLimitMB() int {
	if n.cfg.HeapLimitMB > 0 {
		return n.cfg.HeapLimitMB
	}
	return orgproc.DefaultHeapLimitMB
}

// validateScript refuses a script put that is not well formed, before any state is looked at.
func validateScript(req adminapi.ScriptPut) error {
	if err := checkID("effectId", req.EffectID); err != nil {
		return err
	}
	if !state.ValidWorkerUID(req.WorkerUID) {
		return invalid("workerUid %q must match [A-Za-z0-9][A-Za-z0-9._-]{0,127}", req.WorkerUID)
	}
	if err := checkID("deploymentId", req.DeploymentID); err != nil {
		return err
	}
	if req.Generation < 1 {
		return invalid("generation must be at least 1")
	}
	seen := map[string]bool{}
	for _, s := range req.SecretNames {
		if seen[s] {
			return invalid("secretNames names %q twice", s)
		}
		seen[s] = true
	}
	if err := (workerd.Worker{Modules: req.Modules, MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings.Normalize(), Secrets: req.SecretNames}).Validate(); err != nil {
		return invalid("%v", err)
	}
	return nil
}

// getScript answers one script's status, present or not; with since and wait, once its version
// differs from since, or when wait has passed (a long poll: the Host awaits an admission with it).
func (n *Node) getScript(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	since := q.Get("since")
	var wait time.Duration
	if v := q.Get("wait"); v != "" {
		if wait, err = time.ParseDuration(v); err != nil || wait < 0 {
			return nil, invalid("wait must be a duration such as 5s")
		}
		wait = min(wait, adminapi.StatusWaitMax)
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		n.mu.RLock()
		st := n.scriptStatusLocked(name)
		if since == "" || st.Version != since || wait <= 0 {
			n.mu.RUnlock()
			return st, nil
		}
		changed := n.waitLocked(name)
		n.mu.RUnlock()
		woken := n.awaitChange(r, changed, timer)
		n.doneWaiting(name, changed)
		if !woken {
			return st, nil
		}
		n.statusWakes.Add(1)
	}
}

// deleteScript removes a script only while it belongs to the worker UID the caller names; it waits
// for the script's incarnations to stop, so the answer is the truth about absence.
func (n *Node) deleteScript(_ http.ResponseWriter, r *http.Request) (any, error) {
	name, err := scriptName(r)
	if err != nil {
		return nil, err
	}
	uid := r.URL.Query().Get(adminapi.QueryWorkerUID)
	if uid == "" {
		return nil, invalid("the delete names the worker UID it means: ?workerUid=")
	}
	n.mu.Lock()
	a, retired, err := n.applyLocked(desired.DeleteScript{Name: name, WorkerUID: uid}, name, nil)
	n.mu.Unlock()
	if err != nil {
		return nil, err
	}
	for _, inc := range retired {
		<-inc.Done()
	}
	if a.Changed {
		n.log.Info("script deleted", "script", name, "workerUid", uid)
	}
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.scriptStatusLocked(name), nil
}
