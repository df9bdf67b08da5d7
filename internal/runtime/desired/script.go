package desired

import (
	"slices"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/state"
)

// PutScript deploys one generation of a worker under a script name (PUT /v1/scripts/{name}).
type PutScript struct {
	Effect Effect
	// Script is the deployment asked for, named by its Name. Its Delivery, Admitted and Serving
	// are the node's own and are not read.
	Script state.Script
}

func (op PutScript) apply(s *state.Desired) Answer {
	name, req := op.Script.Name, op.Script
	at := target("script", name)
	if again, r := replay(s, op.Effect, at); r != nil {
		return refused(r)
	} else if again {
		return Answer{Replayed: true}
	}
	cur := s.Scripts[name]
	if cur != nil && cur.WorkerUID != req.WorkerUID {
		// A script is one worker's (SPEC 3.4): no generation, clock or retry order moves it to
		// another worker UID. It is free again only once its holder's delete is confirmed. The
		// answer names nobody: the holder may be another organization's.
		return refused(refusal(adminapi.CodeScriptHeld, ShowsNothing,
			"script %s is held by another worker; it is free once that worker's delete is confirmed", name))
	}
	if floor := s.Floors[name]; cur == nil && req.Generation <= floor {
		// A late copy from a worker this script name has moved past (deleted): it never revives
		// a deleted script.
		return refused(refusal(adminapi.CodeStaleGeneration, ShowsScript, "script %s has moved past generation %d (to %d)", name, req.Generation, floor))
	}
	next := &state.Script{
		Name: name, WorkerUID: req.WorkerUID, DeploymentID: req.DeploymentID, Generation: req.Generation, Labels: req.Labels,
		Modules: req.Modules, MainModule: req.MainModule, CompatibilityDate: req.CompatibilityDate, Settings: req.Settings,
		SecretNames: req.SecretNames, BundleDigest: req.BundleDigest,
	}
	a := Answer{Changed: true, RetryFailed: true, Reconcile: name}
	if cur != nil {
		// Generations only move forward for one worker UID: a late copy of an older PUT can
		// never revert a newer deployment.
		if req.Generation < cur.Generation {
			return refused(refusal(adminapi.CodeStaleGeneration, ShowsScript, "script %s is at generation %d; %d is older", name, cur.Generation, req.Generation))
		}
		if req.Generation == cur.Generation && !sameDeployment(cur, next) {
			return refused(refusal(adminapi.CodeGenerationConflict, ShowsScript, "generation %d of script %s was already deployed with other content", req.Generation, name))
		}
		// The worker's delivered secrets outlive its revisions (SPEC 5, admission), and so does
		// what it serves until the new revision is admitted.
		next.Delivery, next.Admitted, next.Serving = cur.Delivery, cur.Admitted, cur.Serving
	}
	if len(next.SecretNames) == 0 && next.Delivery != nil {
		// A worker that declares no secrets keeps no values here (SPEC 3.5).
		a.Erase, next.Delivery = next.Delivery.WorkerUID, nil
	}
	s.SetScript(next)
	record(s, op.Effect, at)
	return a
}

// sameDeployment reports whether two puts of one generation carry the same content.
func sameDeployment(a, b *state.Script) bool {
	return a.DeploymentID == b.DeploymentID && a.Labels == b.Labels && a.MainModule == b.MainModule &&
		a.CompatibilityDate == b.CompatibilityDate && a.BundleDigest == b.BundleDigest && a.Settings.Equal(b.Settings) &&
		slices.Equal(a.SecretNames, b.SecretNames) && a.Modules.Equal(b.Modules)
}

// DeleteScript removes a script only while it belongs to the worker UID the caller names
// (DELETE /v1/scripts/{name}?workerUid=): the delete of an absent script, or of another worker
// UID's (a successor), changes nothing. The name keeps the deleted generation as its floor.
type DeleteScript struct {
	Name      string
	WorkerUID string
}

func (op DeleteScript) apply(s *state.Desired) Answer {
	cur := s.Scripts[op.Name]
	if cur == nil || cur.WorkerUID != op.WorkerUID {
		return Answer{}
	}
	s.DeleteScript(op.Name)
	if cur.Generation > s.Floors[op.Name] {
		s.SetFloor(op.Name, cur.Generation)
	}
	// The worker's values and log go with it: a later worker of this script name (another UID)
	// starts with its own.
	a := Answer{Changed: true, DropLog: op.WorkerUID, Reconcile: op.Name, AwaitStop: true}
	if cur.Delivery != nil {
		a.Erase = cur.Delivery.WorkerUID
	}
	return a
}
