package resource

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/quota"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// maxModules bounds a worker bundle's module count; its size is bounded by the request body limit.
const maxModules = 64

var (
	moduleName = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}$`)
)

// WorkerSpec is the body of PUT /v1/spaces/{space}/workers/{name}, as the document types it.
type WorkerSpec = apitypes.WorkerSpec

// workerPut is a WorkerSpec validated and normalized: its settings in the runtime's own shape.
type workerPut struct {
	Modules               map[string]string
	ModuleFiles           map[string]string
	MainModule            string
	CompatibilityDate     string
	RequiredSensitiveVars []string
	RuntimeInputReference *string
	OfferingID            *string
	Settings              workerconf.Settings
}

// maxModulePath bounds one module_files path, which the Host keeps and shows but never reads.
const maxModulePath = 1024

// Worker is one stored worker with its derived deployment state.
type Worker struct {
	dbsqlc.WorkerState
	Modules map[string]string
	// ModuleFiles are the modules' file paths as the last put named them (empty without).
	ModuleFiles map[string]string
	Settings    workerconf.Settings
	Placement   Placement
	// Live is how its backend runs it now, when a read asked (nil: not asked).
	Live *Liveness
	// callees are its service bindings' callees, as the put that locked them found them (only a
	// put plans a deployment).
	callees callees
}

// callees are a caller's service bindings as lockCallees found them, in binding name order.
type callees struct {
	names []string
	uids  []uuid.UUID
	// scripts are the callees' script names by binding (what a Cloudflare service binding names).
	scripts map[string]string
}

func workerOf(st dbsqlc.WorkerState) (Worker, error) {
	w := Worker{WorkerState: st, Placement: Placement{OfferingID: st.OfferingID, OfferingDigest: st.OfferingDigest, Pack: st.Pack, Installation: st.Installation}}
	if err := json.Unmarshal(st.Settings, &w.Settings); err != nil {
		return w, err
	}
	if err := json.Unmarshal(st.ModuleFiles, &w.ModuleFiles); err != nil {
		return w, err
	}
	return w, json.Unmarshal(st.Modules, &w.Modules)
}

// Deployed is readiness of the code alone: live (or being created by operation op), and the
// current generation's deployment active.
func (w Worker) Deployed(op uuid.UUID) bool {
	return (w.Status == dbsqlc.ResourceStatusLive || (w.Status == dbsqlc.ResourceStatusCreating && w.OperationID == op)) && w.DeploymentStatus == string(dbsqlc.DeploymentStatusActive)
}

// inputsSettled reports whether the worker's secrets are delivered to it (SPEC 3.5): a worker
// without required sensitive vars needs none.
func (w Worker) inputsSettled() bool {
	if len(w.RequiredSensitiveVars) == 0 && w.RuntimeInputReference == nil {
		return true
	}
	return w.RuntimeInputStatus != nil && *w.RuntimeInputStatus == dbsqlc.RuntimeInputStatusSettled &&
		w.RuntimeInputWorkerUID != nil && *w.RuntimeInputWorkerUID == w.UID
}

// Ready is readiness as derived now: live, holding its script name, the current generation's
// deployment active, its runtime input, if it names one, settled for this worker, and (when asked)
// the backend serving that deployment now. It is the Ready condition, so the two never disagree.
func (w Worker) Ready() bool { return w.conditions()[0].Status == "True" }

func (w Worker) conditions() []Condition {
	c := Condition{Type: "Ready", Status: "False"}
	switch {
	case w.Status == dbsqlc.ResourceStatusDeleted:
		c.Reason, c.Message = "Deleted", "the worker was deleted"
	case w.Status == dbsqlc.ResourceStatusDeleting:
		c.Reason, c.Message = "Deleting", "the worker is being deleted"
	case w.ScriptCollision:
		c.Reason, c.Message = "ScriptNameCollision", "the worker's v1 script name is held by an earlier worker on its backend; replace the worker (a new worker gets a v2 name)"
	case w.DeploymentStatus == string(dbsqlc.DeploymentStatusFailed):
		c.Reason, c.Message = "DeploymentFailed", "the backend refused the current generation; apply again to retry"
	case w.DeploymentStatus != string(dbsqlc.DeploymentStatusActive) || w.Status != dbsqlc.ResourceStatusLive:
		c.Reason, c.Message = "DeploymentPending", "the current generation has no active deployment yet"
	case !w.inputsSettled():
		c.Reason, c.Message = "RuntimeInputPending", "the worker's runtime input is not delivered to it yet"
		if w.RuntimeInputStatus != nil && *w.RuntimeInputStatus == dbsqlc.RuntimeInputStatusSettled {
			c.Message = "the runtime input named is settled for another worker UID: a replaced worker needs a new runtime input (bump bindings_wo_version)"
		}
	case !w.Live.serves(w.DeploymentID):
		c.Reason, c.Message = w.Live.condition(w.DeploymentID)
	default:
		c.Status, c.Reason, c.Message = "True", "DeploymentActive", "the current generation's deployment is active and serving"
	}
	out := []Condition{c}
	if w.Live != nil && w.Live.Obs.Incident {
		out = append(out, Condition{Type: "Incident", Status: "True", Reason: "RestartLoop", Message: w.Live.Obs.IncidentMessage})
	}
	if w.Live != nil && w.Live.Obs.Quarantined {
		out = append(out, Condition{Type: "Quarantined", Status: "True", Reason: "RuntimeQuarantined", Message: w.Live.Obs.QuarantineMessage})
	}
	return out
}

// WorkerProjection is the public view of a worker: the document's Worker (api/apitypes), with
// the bytes a response carries.
type WorkerProjection apitypes.Worker

// RuntimeInputsView is the worker's runtime input: its reference and lease status, never values.
type RuntimeInputsView = apitypes.RuntimeInputs

// Project renders w with its ownership token.
func (w Worker) Project(token string) WorkerProjection {
	p := WorkerProjection{
		UID: w.UID.String(), Space: w.Space, Name: w.Name, Generation: w.Generation, Revision: w.Revision,
		Ready: w.Ready(), Conditions: w.conditions(), ScriptName: w.ScriptName, Modules: w.Modules,
		MainModule: w.MainModule, CompatibilityDate: w.CompatibilityDate, RequiredSensitiveVars: w.RequiredSensitiveVars,
		OfferingID: w.Placement.OfferingID, ModuleFiles: w.moduleFiles(),
	}
	if p.RequiredSensitiveVars == nil {
		p.RequiredSensitiveVars = []string{}
	}
	p.Vars, p.JSONVars, p.CompatibilityFlags = w.Settings.Vars, w.Settings.JSONVars, w.Settings.CompatibilityFlags
	if p.Vars == nil {
		p.Vars = map[string]string{}
	}
	if p.JSONVars == nil {
		p.JSONVars = map[string]string{}
	}
	if p.CompatibilityFlags == nil {
		p.CompatibilityFlags = []string{}
	}
	p.ServiceBindings, p.Limits = w.Settings.ServiceBindings, (*apitypes.WorkerLimits)(w.Settings.Limits)
	if p.ServiceBindings == nil {
		p.ServiceBindings = map[string]string{}
	}
	if p.Crons = w.Settings.Crons; p.Crons == nil {
		p.Crons = []string{}
	}
	if w.RuntimeInputReference != nil {
		status := "missing"
		if w.RuntimeInputStatus != nil {
			status = string(*w.RuntimeInputStatus)
		}
		p.RuntimeInputs = &RuntimeInputsView{Reference: *w.RuntimeInputReference, Status: status}
	}
	if token != "" {
		p.OwnershipToken = &token
	}
	return p
}

// JSON is the projection's bytes.
func (p WorkerProjection) JSON() []byte { return wire.JSON(p) }

// Digests is the projection with each module's digest and the bundle's size instead of the
// modules (a read with ?modules=digests).
func (p WorkerProjection) Digests() WorkerProjection {
	p.ModuleSha256 = make(map[string]string, len(p.Modules))
	for name, value := range p.Modules {
		p.ModuleSha256[name] = workerconf.ModuleDigest(name, value)
	}
	size := workerconf.WireBytes(p.Modules)
	p.BundleBytes, p.Modules = &size, map[string]string{}
	return p
}

// validateWorker checks a put's body and gives it normalized: required vars sorted without
// repeats, an empty reference as none, the settings in the runtime's shape.
func validateWorker(space, name string, body WorkerSpec) (workerPut, error) {
	spec := workerPut{Modules: body.Modules, ModuleFiles: body.ModuleFiles, MainModule: body.MainModule, CompatibilityDate: body.CompatibilityDate,
		RuntimeInputReference: body.RuntimeInputReference, OfferingID: body.OfferingID,
		Settings: workerconf.Settings{Vars: body.Vars, JSONVars: body.JSONVars, CompatibilityFlags: body.CompatibilityFlags, ServiceBindings: body.ServiceBindings, Crons: body.Crons}}
	if body.Limits != nil {
		spec.Settings.Limits = &workerconf.Limits{CPUMs: body.Limits.CPUMs, MemoryMB: body.Limits.MemoryMB}
	}
	if !vocab.Name.MatchString(space) {
		return spec, apierr.New(apierr.InvalidRequest, "space %q must match %s", space, vocab.NamePattern)
	}
	if !vocab.Name.MatchString(name) {
		return spec, apierr.New(apierr.InvalidRequest, "worker name %q must match %s", name, vocab.NamePattern)
	}
	if len(spec.Modules) == 0 || len(spec.Modules) > maxModules {
		return spec, apierr.New(apierr.InvalidRequest, "modules must hold 1 to %d modules", maxModules)
	}
	for n := range spec.Modules {
		if !moduleName.MatchString(n) || strings.Contains(n, "..") {
			return spec, apierr.New(apierr.InvalidRequest, "module name %q must match %s", n, moduleName)
		}
	}
	if _, ok := spec.Modules[spec.MainModule]; !ok {
		return spec, apierr.New(apierr.InvalidRequest, "mainModule %q must name one of the modules", spec.MainModule)
	}
	if err := workerconf.CheckModules(spec.Modules, spec.MainModule); err != nil {
		return spec, apierr.New(apierr.InvalidRequest, "%v", err)
	}
	if err := validateModuleFiles(spec.Modules, spec.ModuleFiles); err != nil {
		return spec, err
	}
	if spec.ModuleFiles == nil {
		spec.ModuleFiles = map[string]string{}
	}
	date, err := time.Parse(time.DateOnly, spec.CompatibilityDate)
	if err != nil {
		return spec, apierr.New(apierr.InvalidRequest, "compatibilityDate %q must be a date such as 2025-01-01", spec.CompatibilityDate)
	}
	if date.After(time.Now().UTC().AddDate(0, 0, 1)) {
		// No runtime knows the behaviour of a date that has not come yet.
		return spec, apierr.New(apierr.InvalidRequest, "compatibilityDate %s is in the future", spec.CompatibilityDate)
	}
	seen := map[string]bool{}
	for _, v := range body.RequiredSensitiveVars {
		if !vocab.BindingName.MatchString(v) {
			return spec, apierr.New(apierr.InvalidRequest, "requiredSensitiveVars entry %q must match %s", v, vocab.BindingNamePattern)
		}
		if seen[v] {
			return spec, apierr.New(apierr.InvalidRequest, "requiredSensitiveVars names %q twice", v)
		}
		seen[v] = true
	}
	spec.RequiredSensitiveVars = append([]string{}, slices.Sorted(maps.Keys(seen))...)
	if spec.RuntimeInputReference != nil && *spec.RuntimeInputReference == "" {
		spec.RuntimeInputReference = nil
	}
	if len(spec.RequiredSensitiveVars) > 0 && spec.RuntimeInputReference == nil {
		return spec, apierr.New(apierr.InvalidRequest, "the worker requires sensitive vars %s but names no runtimeInputReference", strings.Join(spec.RequiredSensitiveVars, ", "))
	}
	spec.Settings = spec.Settings.Normalize()
	if err := spec.Settings.Validate(spec.RequiredSensitiveVars); err != nil {
		return spec, apierr.New(apierr.InvalidRequest, "%v", err)
	}
	return spec, nil
}

// validateModuleFiles checks moduleFiles: none, or one path for each module and no other.
func validateModuleFiles(modules, files map[string]string) error {
	if len(files) == 0 {
		return nil
	}
	for n := range files {
		if _, ok := modules[n]; !ok {
			return apierr.New(apierr.InvalidRequest, "moduleFiles names %q, which is not one of the modules", n)
		}
	}
	for n := range modules {
		path, ok := files[n]
		if !ok {
			return apierr.New(apierr.InvalidRequest, "moduleFiles gives no path for module %q: give one for every module, or leave moduleFiles out", n)
		}
		if path == "" || len(path) > maxModulePath || strings.ContainsFunc(path, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
			return apierr.New(apierr.InvalidRequest, "moduleFiles path of module %q must be 1 to %d bytes without control characters", n, maxModulePath)
		}
	}
	return nil
}

// lockWorker reads and locks a worker by UID, or the standing one named space/name when uid is nil.
func lockWorker(ctx context.Context, q *dbsqlc.Queries, org string, uid *uuid.UUID, space, name string) (Worker, error) {
	st, err := q.WorkerLock(ctx, dbsqlc.WorkerLockParams{OrganizationID: org, UID: uid, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) {
		return Worker{}, apierr.New(apierr.NotFound, "no worker %s/%s", space, name)
	}
	if err != nil {
		return Worker{}, fmt.Errorf("resource: lock worker: %w", err)
	}
	return workerOf(st)
}

// GetWorker reads the present worker space/name (one whose create never committed is absent) and
// the owning token of its ownership key, in one round trip, taking no lock, and asks its backend
// how it runs now.
func (s *Service) GetWorker(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, space, name string) (Worker, string, error) {
	row, err := dbsqlc.New(db).WorkerRead(ctx, dbsqlc.WorkerReadParams{
		OwnershipKind: WorkerKind, OwnershipKey: space + "/" + name, OrganizationID: org.ID, Space: space, Name: name})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !row.WorkerState.Present) {
		return Worker{}, "", apierr.New(apierr.NotFound, "no worker %s/%s", space, name)
	}
	if err != nil {
		return Worker{}, "", fmt.Errorf("resource: get worker: %w", err)
	}
	w, err := workerOf(row.WorkerState)
	if err != nil {
		return Worker{}, "", err
	}
	w.Live = s.observe(ctx, w.Placement, backend.NativeWorker, w.ScriptName)
	return w, row.OwnershipToken, nil
}

// GetWorkerByUID reads the present worker of the organization with that UID, as GetWorker does
// (without its ownership token: the UID names the worker, not its owner's key). A deleted or
// replaced worker, or another organization's, is not found.
func (s *Service) GetWorkerByUID(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, uid uuid.UUID) (Worker, error) {
	st, err := dbsqlc.New(db).WorkerGet(ctx, dbsqlc.WorkerGetParams{OrganizationID: org.ID, UID: &uid})
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && !st.Present) {
		return Worker{}, apierr.New(apierr.NotFound, "no worker with uid %s", uid)
	}
	if err != nil {
		return Worker{}, fmt.Errorf("resource: get worker by uid: %w", err)
	}
	w, err := workerOf(st)
	if err != nil {
		return Worker{}, err
	}
	w.Live = s.observe(ctx, w.Placement, backend.NativeWorker, w.ScriptName)
	return w, nil
}

func (w *Worker) save(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID) error {
	modules, err := json.Marshal(w.Modules)
	if err != nil {
		return err
	}
	files, err := json.Marshal(w.moduleFiles())
	if err != nil {
		return err
	}
	settings, err := json.Marshal(w.Settings)
	if err != nil {
		return err
	}
	// The bundle the active deployment runs is kept while the new generation is not active, for
	// a node that must be written it again (a member joining the pool, one that lost its state).
	if err := q.WorkerKeepActiveBundle(ctx, dbsqlc.WorkerKeepActiveBundleParams{UID: w.UID, Generation: w.Generation}); err != nil {
		return fmt.Errorf("resource: keep the active deployment's bundle: %w", err)
	}
	revision, err := q.WorkerUpdate(ctx, dbsqlc.WorkerUpdateParams{
		UID: w.UID, Revision: w.Revision, Generation: w.Generation, Modules: modules, ModuleFiles: files, MainModule: w.MainModule,
		CompatibilityDate: w.CompatibilityDate, Settings: settings, RequiredSensitiveVars: w.RequiredSensitiveVars,
		RuntimeInputReference: w.RuntimeInputReference, Status: w.Status, OperationID: operation,
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.IntentInProgress, "the worker changed during this request; retry")
	}
	if err != nil {
		return fmt.Errorf("resource: save worker: %w", err)
	}
	w.Revision, w.OperationID = revision, operation
	return nil
}

// desired is what the worker's deployment writes on its backend. Its labels name the
// organization as operators type it, for the runtime's scoped brakes.
func (w Worker) desired(org auth.Organization) backend.Desired {
	return backend.Desired{
		Kind: backend.NativeWorker, NativeName: w.ScriptName, ResourceUID: w.UID,
		Labels:      backend.Labels{Organization: org.Name, Space: w.Space, Worker: w.Name},
		Bundle:      &backend.Bundle{Modules: w.Modules, MainModule: w.MainModule, CompatibilityDate: w.CompatibilityDate, Settings: w.Settings, ServiceScripts: w.callees.scripts},
		SecretNames: w.RequiredSensitiveVars,
	}
}

// moduleFiles is never null in the row.
func (w Worker) moduleFiles() map[string]string {
	if w.ModuleFiles == nil {
		return map[string]string{}
	}
	return w.ModuleFiles
}

// sameSpec is whether spec deploys what w deploys. Module file paths are not part of it: they
// change the revision alone.
func sameSpec(w Worker, spec workerPut) bool {
	return maps.Equal(w.Modules, spec.Modules) && w.MainModule == spec.MainModule &&
		w.CompatibilityDate == spec.CompatibilityDate && w.Settings.Equal(spec.Settings) && slices.Equal(w.RequiredSensitiveVars, spec.RequiredSensitiveVars) &&
		equalPtr(w.RuntimeInputReference, spec.RuntimeInputReference)
}

func equalPtr(a, b *string) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// PutWorker creates the worker, or applies a changed spec as a new generation, and has it consume
// its runtime input. Its phases: plan (one transaction, which takes the key), apply (one backend
// call), consume (the lease's own phases), commit (one transaction that records the outcome, the
// settle, the worker's state and the binding).
func (s *Service) PutWorker(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string, body WorkerSpec) (ownership.Response, error) {
	spec, err := validateWorker(space, name, body)
	if err != nil {
		return ownership.Response{}, err
	}
	offering, inst, err := s.selectOffering(org, catalog.KindWorker, spec.OfferingID)
	if err != nil {
		return ownership.Response{}, err
	}
	if err := offering.Ceilings().Check(spec.Settings.Limits); err != nil {
		return ownership.Response{}, apierr.New(apierr.InvalidRequest, "%v", err)
	}
	if size, most := workerconf.BundleBytes(spec.Modules), offering.BundleCeiling(); size > most {
		return ownership.Response{}, apierr.New(apierr.BodyTooLarge, "the bundle holds %d bytes (module names and contents); offering %s takes at most %d (maxBundleBytes)", size, offering.ID, most)
	}
	if len(spec.Settings.Crons) > 0 && offering.CronDelivery() == "" {
		return ownership.Response{}, apierr.New(apierr.CronsUnsupported, "offering %s (%s) runs no cron triggers (its cronDelivery is null); leave crons out, or choose an offering that has them", offering.ID, offering.Pack)
	}
	if workerconf.HasSourceMaps(spec.Modules) && offering.Pack != catalog.PackSelfhost {
		return ownership.Response{}, apierr.New(apierr.InvalidRequest, "the bundle carries a source map, which only a selfhost offering keeps (it names original places in the worker's log); offering %s runs on %s: leave the .map modules out", offering.ID, offering.Pack)
	}
	placement := offering.Placement()
	mut, err := s.mutator(placement)
	if err != nil {
		return ownership.Response{}, err
	}
	run := s.putEffects(m, org.ID, dbsqlc.ResourceKindWorker, placement, mut)
	w, err := s.planWorker(ctx, m, run, org, space, name, spec, placement)
	if err != nil {
		return ownership.Response{}, err
	}
	if err := run.perform(ctx, func(o outcome) error {
		if errors.Is(o.err, backend.ErrScriptHeld) {
			return s.scriptHeld(ctx, m, w)
		}
		return backendFailed(o)
	}); err != nil {
		return ownership.Response{}, err
	}
	var settle func(context.Context, pgx.Tx) error
	if w.RuntimeInputReference != nil && !w.inputsSettled() {
		// The deployment must read active before the reservation can be bound to it.
		if err := run.recordNow(ctx); err != nil {
			return ownership.Response{}, err
		}
		if settle, err = s.consume(ctx, m, org, w, inst); err != nil {
			run.undo(ctx) // a create whose runtime input was refused never existed
			return ownership.Response{}, err
		}
	}
	// Its limit where the backend's routing carries it (wfp-managed): converged after every apply,
	// and on a re-run with nothing to apply, so that a run cut short converges the next time.
	if err := s.convergeLimits(ctx, mut, w); err != nil {
		// The deployment itself is done: recorded, so the re-run needs only the limits.
		if txErr := run.recordNow(ctx); txErr != nil {
			return ownership.Response{}, txErr
		}
		return ownership.Response{}, err
	}
	// The answer says how the backend runs the worker now: the new deployment (or the one
	// already active), with its delivered values when it has some.
	deployment := w.DeploymentID
	if d, ok := run.plannedDeployment(); ok {
		deployment = d
	}
	live := s.awaitServing(ctx, w.Placement, w.ScriptName, deployment, 30*time.Second)
	// A script that landed for a worker that will not commit is taken down again.
	return run.commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		return s.commitWorker(ctx, tx, m, org, w, settle, live)
	})
}

// commitWorker is the worker put's own part of its commit transaction, after the record: the
// runtime input settled, the bindings of a generation now deployed, the worker live, its answer.
func (s *Service) commitWorker(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org auth.Organization, put Worker, settle func(context.Context, pgx.Tx) error, live *Liveness) (ownership.Response, error) {
	q := dbsqlc.New(tx)
	if settle != nil {
		if err := settle(ctx, tx); err != nil {
			return ownership.Response{}, err
		}
	}
	w, err := lockWorker(ctx, q, org.ID, &put.UID, put.Space, put.Name)
	if err != nil {
		return ownership.Response{}, err
	}
	if w.Generation == put.Generation && w.DeploymentStatus == string(dbsqlc.DeploymentStatusActive) {
		// This generation is deployed: the index drops the bindings of the one it replaced.
		if err := keepBindings(ctx, q, w.UID, put.callees); err != nil {
			return ownership.Response{}, err
		}
	}
	if w.Status == dbsqlc.ResourceStatusCreating {
		w.Status = dbsqlc.ResourceStatusLive
		if err := w.save(ctx, q, m.Operation); err != nil {
			return ownership.Response{}, err
		}
		if w, err = lockWorker(ctx, q, org.ID, &w.UID, put.Space, put.Name); err != nil {
			return ownership.Response{}, err
		}
	}
	w.Live = live
	return ownership.Answer(m.Current == nil, w.Project(m.Intent.Token).JSON(), w.UID), nil
}

// convergeLimits is the limits phase of a worker's put (SPEC 8): on a pack whose routing carries
// a worker's cpuMs (wfp-managed), its script entry is rewritten with it (backend calls only), which
// every route and service binding of the worker reads its limit from.
func (s *Service) convergeLimits(ctx context.Context, mut backend.Mutator, w Worker) error {
	if w.Placement.Pack != catalog.PackWFPManaged {
		return nil
	}
	limits := backend.WorkerLimits{ScriptName: w.ScriptName, WorkerUID: w.UID.String(), CPUMs: w.Settings.LimitsOrZero().CPUMs}
	cctx, cancel := context.WithTimeout(ctx, BackendCallTimeout)
	defer cancel()
	if err := backend.ConvergeLimits(cctx, mut, limits); err != nil {
		if p := backend.Problem(err, "apply again"); p != nil {
			return p
		}
		if errors.Is(err, backend.ErrUnreachable) {
			return apierr.New(apierr.BackendUnreachable, "the backend could not be reached to apply the worker's limits to its routing; apply again to retry")
		}
		return apierr.New(apierr.BackendFailed, "the worker is deployed, but its limits could not be written into its routing; apply again to retry")
	}
	return nil
}

// scriptHeld is the refusal of a worker whose script name the backend holds for another worker UID
// (SPEC 3.4): retryable when the holder is this organization's deleted worker whose delete the
// janitor has yet to confirm, final otherwise. It names nobody else.
func (s *Service) scriptHeld(ctx context.Context, m *ownership.Mutation, w Worker) error {
	var pending bool
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		pending, err = dbsqlc.New(tx).WorkerScriptHolderDeleted(ctx, dbsqlc.WorkerScriptHolderDeletedParams{
			OrganizationID: w.OrganizationID, Installation: w.Placement.Installation, ScriptName: w.ScriptName, UID: w.UID,
		})
		return err
	})
	if err != nil {
		return err
	}
	if pending {
		return apierr.New(apierr.WitnessOpen, "script %s is still held by this organization's deleted worker %s/%s until its delete is confirmed; retry shortly", w.ScriptName, w.Space, w.Name).
			With("unmetFences", []string{"deployment_live"})
	}
	return apierr.New(apierr.ScriptHeld, "script %s is held by another worker on installation %s; this worker cannot take it", w.ScriptName, w.Placement.Installation)
}

// planWorker is the first phase: it takes the key and, in one transaction, creates the worker's
// row or writes its new generation, and plans the deployment with run (none when nothing changes).
func (s *Service) planWorker(ctx context.Context, m *ownership.Mutation, run *effects, org auth.Organization, space, name string, spec workerPut, placement Placement) (Worker, error) {
	var w Worker
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		// The deployment brake was checked in the lock step (the intent names this worker).
		if m.Current == nil {
			// The callees' rows first, as an update takes them: a wait for a callee's delete to
			// decide holds no quota slot that other creates need.
			bound, err := lockCallees(ctx, q, org.ID, nil, placement.Installation, spec.Settings.ServiceBindings)
			if err != nil {
				return err
			}
			// The organization's worker ceiling (SPEC 5.1), holding one of its quota slots until this
			// transaction ends, so that no other create of the organization counts beside it.
			if err := quota.Check(ctx, tx, s.Catalog.Quotas, org.ID, quota.Workers); err != nil {
				return err
			}
			// A Cloudflare account holds a limited number of scripts across every organization
			// sold the installation (SPEC 8): its ceiling, under one of its slots' locks.
			if inst, ok := s.Catalog.Installations[placement.Installation]; ok && inst.Pack != catalog.PackSelfhost {
				if err := quota.CheckScripts(ctx, tx, inst.Name, inst.Scripts()); err != nil {
					return err
				}
			}
			if err := s.checkCronCeiling(ctx, q, placement.Installation, uuid.Nil, spec.Settings.Crons); err != nil {
				return err
			}
			w = Worker{Modules: spec.Modules, ModuleFiles: spec.ModuleFiles, Settings: spec.Settings, Placement: placement, callees: bound}
			w.UID, w.OrganizationID, w.Space, w.Name, w.Generation, w.Revision = uuid.New(), org.ID, space, name, 1, 1
			w.MainModule, w.CompatibilityDate, w.RequiredSensitiveVars = spec.MainModule, spec.CompatibilityDate, spec.RequiredSensitiveVars
			w.RuntimeInputReference, w.Status, w.OperationID = spec.RuntimeInputReference, dbsqlc.ResourceStatusCreating, m.Operation
			w.ScriptName = backend.ScriptName(backend.WorkerRef{TenantRef: org.ID, Space: space, Name: name})
			if err := s.admitInput(ctx, tx, w, spec); err != nil {
				return err
			}
			modules, err := json.Marshal(w.Modules)
			if err != nil {
				return err
			}
			files, err := json.Marshal(w.moduleFiles())
			if err != nil {
				return err
			}
			settings, err := json.Marshal(w.Settings)
			if err != nil {
				return err
			}
			err = q.WorkerInsert(ctx, dbsqlc.WorkerInsertParams{
				UID: w.UID, OrganizationID: org.ID, Space: space, Name: name, Modules: modules, ModuleFiles: files, MainModule: w.MainModule,
				CompatibilityDate: w.CompatibilityDate, Settings: settings, RequiredSensitiveVars: w.RequiredSensitiveVars,
				RuntimeInputReference: w.RuntimeInputReference, ScriptName: w.ScriptName,
				OfferingID: placement.OfferingID, OfferingDigest: placement.OfferingDigest, Pack: placement.Pack,
				Installation: placement.Installation, OperationID: m.Operation,
			})
			if store.IsUniqueViolation(err, "workers_live_key") {
				return apierr.New(apierr.ResourceExists, "worker %s/%s already exists and is owned by another token; import it to adopt it", space, name)
			}
			if store.IsUniqueViolation(err, "workers_script_key") {
				// A script name is one worker's in its namespace, across organizations (SPEC 3.4).
				return apierr.New(apierr.ScriptHeld, "script %s is held by another worker on installation %s; this worker cannot take it", w.ScriptName, placement.Installation)
			}
			if err != nil {
				return fmt.Errorf("resource: create worker: %w", err)
			}
			if err := checkLateWrites(ctx, q, w); err != nil {
				return err
			}
			if err := addBindings(ctx, q, w.UID, w.callees); err != nil {
				return err
			}
			return run.apply(ctx, q, w.UID, w.Generation, w.desired(org))
		}
		// The caller's row and its callees' rows, in UID order, before anything else is locked.
		bound, err := lockCallees(ctx, q, org.ID, &m.Current.UID, placement.Installation, spec.Settings.ServiceBindings)
		if err != nil {
			return err
		}
		if w, err = lockWorker(ctx, q, org.ID, &m.Current.UID, space, name); err != nil {
			return err
		}
		w.callees = bound
		if err := m.CheckRevisionAfter(ctx, tx, w.Revision, w.OperationID); err != nil {
			return err
		}
		if w.Status == dbsqlc.ResourceStatusDeleting || w.Status == dbsqlc.ResourceStatusDeleted {
			return apierr.New(apierr.Conflict, "worker %s/%s is being deleted; finish the delete first", space, name)
		}
		if w.ScriptCollision {
			// Its v1 script name is an earlier worker's (SPEC 3.4): it never writes that script
			// again. A new worker gets a v2 name.
			return apierr.New(apierr.ScriptHeld, "worker %s/%s runs under v1 script name %s, which an earlier worker holds; replace it (destroy and create it again) to get a v2 name", space, name, w.ScriptName)
		}
		if w.Placement.OfferingID != placement.OfferingID || w.Placement.OfferingDigest != placement.OfferingDigest {
			return apierr.New(apierr.PlacementDrift, "worker %s/%s runs on offering %s (digest %.12s); it cannot move to %s (digest %.12s) in place: replace it",
				space, name, w.Placement.OfferingID, w.Placement.OfferingDigest, placement.OfferingID, placement.OfferingDigest)
		}
		changed := !sameSpec(w, spec)
		if changed {
			if err := s.checkCronCeiling(ctx, q, placement.Installation, w.UID, spec.Settings.Crons); err != nil {
				return err
			}
		}
		if err := s.admitInput(ctx, tx, w, spec); err != nil {
			return err
		}
		if !changed && !maps.Equal(w.moduleFiles(), spec.ModuleFiles) {
			// The paths alone: a new revision of the same generation, nothing to deploy.
			w.ModuleFiles = spec.ModuleFiles
			if err := w.save(ctx, q, m.Operation); err != nil {
				return err
			}
			if w, err = lockWorker(ctx, q, org.ID, &m.Current.UID, space, name); err != nil {
				return err
			}
			w.callees = bound
		}
		if changed {
			w.Generation++
			w.Modules, w.ModuleFiles, w.MainModule, w.CompatibilityDate, w.RequiredSensitiveVars = spec.Modules, spec.ModuleFiles, spec.MainModule, spec.CompatibilityDate, spec.RequiredSensitiveVars
			w.Settings, w.RuntimeInputReference = spec.Settings, spec.RuntimeInputReference
			if err := w.save(ctx, q, m.Operation); err != nil {
				return err
			}
			if err := addBindings(ctx, q, w.UID, w.callees); err != nil {
				return err
			}
			// Read back: the runtime input's status is the new reference's, not the old one's.
			if w, err = lockWorker(ctx, q, org.ID, &m.Current.UID, space, name); err != nil {
				return err
			}
			w.callees = bound
		}
		if changed || w.DeploymentStatus != string(dbsqlc.DeploymentStatusActive) {
			return run.apply(ctx, q, w.UID, w.Generation, w.desired(org))
		}
		return nil
	})
	return w, err
}

// admitInput refuses, in the put's plan transaction, a runtime input the put's worker w could not
// take when it consumes it (another target or binding names, delivered to or claimed by another
// worker): refused there, the put changes and deploys nothing (SPEC 3.5). The claim itself comes
// after the deployment, where consume checks again (and sweeps an input whose time ran out).
func (s *Service) admitInput(ctx context.Context, tx pgx.Tx, w Worker, spec workerPut) error {
	if spec.RuntimeInputReference == nil || s.RuntimeInputs == nil {
		return nil
	}
	return s.RuntimeInputs.Admissible(ctx, tx, runtimeinput.Consumer{
		Incarnation: reservation.WorkerIncarnation{OrganizationID: w.OrganizationID, UID: w.UID, Revision: w.Revision, Space: w.Space, Name: w.Name},
		Required:    spec.RequiredSensitiveVars,
	}, *spec.RuntimeInputReference)
}

// consume has the worker take its runtime input (SPEC 3.5) up to the readback, and returns the
// settle, which the worker's commit transaction runs.
func (s *Service) consume(ctx context.Context, m *ownership.Mutation, org auth.Organization, w Worker, inst catalog.Installation) (func(context.Context, pgx.Tx) error, error) {
	if s.RuntimeInputs == nil {
		return nil, apierr.New(apierr.NotImplemented, "this Host serves no runtime inputs")
	}
	var inc reservation.WorkerIncarnation
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		_, inc, err = readyWorker(ctx, dbsqlc.New(tx), org.ID, w.Space, w.Name, m.Operation, false)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.RuntimeInputs.Consume(ctx, m, runtimeinput.Consumer{
		Incarnation: inc, ScriptName: w.ScriptName, Required: w.RequiredSensitiveVars, Installation: inst,
	}, *w.RuntimeInputReference, s.Hooks)
}

// readyWorker loads and locks the worker named space/name, proves it Ready as derived now (its
// code, and with needInputs its runtime input too; a worker being created by operation op counts
// as standing), and returns it with its active deployment's placement, for binding and minting.
func readyWorker(ctx context.Context, q *dbsqlc.Queries, org, space, name string, op uuid.UUID, needInputs bool) (Worker, reservation.WorkerIncarnation, error) {
	w, err := lockWorker(ctx, q, org, nil, space, name)
	if err != nil {
		return Worker{}, reservation.WorkerIncarnation{}, err
	}
	if !w.Deployed(op) || (needInputs && !w.inputsSettled()) {
		return Worker{}, reservation.WorkerIncarnation{}, apierr.New(apierr.WorkerNotReady, "worker %s/%s is not Ready (%s); apply it first", space, name, w.conditions()[0].Reason)
	}
	inc := reservation.WorkerIncarnation{OrganizationID: org, UID: w.UID, Revision: w.Revision, Space: space, Name: name}
	row, err := q.DeploymentActivePlacement(ctx, w.UID)
	if errors.Is(err, pgx.ErrNoRows) {
		return Worker{}, reservation.WorkerIncarnation{}, apierr.New(apierr.WorkerNotReady, "worker %s/%s has no active deployment", space, name)
	}
	if err != nil {
		return Worker{}, reservation.WorkerIncarnation{}, fmt.Errorf("resource: worker placement: %w", err)
	}
	inc.Placement = Placement{OfferingID: row.OfferingID, OfferingDigest: row.OfferingDigest, Pack: row.Pack, Installation: row.Installation}
	return w, inc, nil
}

// DeleteWorker deletes the worker the mutation's binding names. It is refused while an endpoint
// still stands on the worker (SPEC 3.3, safe destroy order) or a claim on it is unexpired. Its
// phases: mark deleting and plan (one transaction), delete (backend calls), commit (close the
// attestation, release its Host-minted reservations, tombstone).
func (s *Service) DeleteWorker(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string) (ownership.Response, error) {
	var w Worker
	var run *effects
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		q := dbsqlc.New(tx)
		var err error
		if w, err = lockWorker(ctx, q, org.ID, &m.Current.UID, space, name); err != nil {
			return err
		}
		run = s.deleteEffects(m, org.ID, dbsqlc.ResourceKindWorker, w.UID, w.Placement)
		if w.Status == dbsqlc.ResourceStatusDeleted {
			return nil
		}
		if err := w.markDeleting(ctx, q, m.Operation); err != nil {
			return err
		}
		return run.remove(ctx, q)
	})
	if err != nil {
		return ownership.Response{}, err
	}
	if err := run.perform(ctx, deleteUnconfirmed); err != nil {
		return ownership.Response{}, err
	}
	return run.commit(ctx, func(tx pgx.Tx) (ownership.Response, error) {
		return s.tombstoneWorker(ctx, tx, m, org, w)
	})
}

// markDeleting is the worker delete's own part of its plan transaction: refused while an endpoint
// still stands on the worker (SPEC 3.3, safe destroy order), a caller binds to it, or a
// runtime-input claim on it is unexpired; otherwise the worker is marked deleting.
func (w *Worker) markDeleting(ctx context.Context, q *dbsqlc.Queries, operation uuid.UUID) error {
	endpoints, err := q.WorkerStandingEndpoints(ctx, w.UID)
	if err != nil {
		return fmt.Errorf("resource: worker endpoints: %w", err)
	}
	if len(endpoints) > 0 {
		return apierr.New(apierr.WorkerHasEndpoints, "worker %s/%s still has endpoints (%s): destroy them first", w.Space, w.Name, strings.Join(endpoints, ", ")).
			With("endpoints", endpoints)
	}
	// Under this row's lock: a caller's put that binds to it locks it too (lockCallees), so
	// either that put committed its binding before this reads, or it waits and then finds the
	// worker being deleted (SPEC 3.6).
	callers, err := q.WorkerCallers(ctx, w.UID)
	if err != nil {
		return fmt.Errorf("resource: worker callers: %w", err)
	}
	if len(callers) > 0 {
		return apierr.New(apierr.WorkerHasCallers, "worker %s/%s is bound to by %s: destroy them, or remove their service bindings to it, first", w.Space, w.Name, strings.Join(callers, ", ")).
			With("callers", callers)
	}
	claims, err := q.PreparationClaimsOnWorker(ctx, &w.UID)
	if err != nil {
		return fmt.Errorf("resource: worker claims: %w", err)
	}
	if len(claims) > 0 {
		return apierr.New(apierr.LeaseClaimed, "worker %s/%s holds an unexpired runtime-input claim (%s); its deletion waits until the lease settles, is aborted or expires", w.Space, w.Name, strings.Join(claims, ", "))
	}
	if w.Status != dbsqlc.ResourceStatusDeleting {
		w.Status = dbsqlc.ResourceStatusDeleting
		if err := w.save(ctx, q, operation); err != nil {
			return err
		}
	}
	return nil
}

// tombstoneWorker is the worker delete's own part of its commit transaction, after the record:
// the worker deleted, and its Host-minted reservations released.
func (s *Service) tombstoneWorker(ctx context.Context, tx pgx.Tx, m *ownership.Mutation, org auth.Organization, deleting Worker) (ownership.Response, error) {
	q := dbsqlc.New(tx)
	w, err := lockWorker(ctx, q, org.ID, &deleting.UID, deleting.Space, deleting.Name)
	if err != nil {
		return ownership.Response{}, err
	}
	if w.Status != dbsqlc.ResourceStatusDeleted {
		w.Status = dbsqlc.ResourceStatusDeleted
		if err := w.save(ctx, q, m.Operation); err != nil {
			return ownership.Response{}, err
		}
	}
	// That worker UID can never mint again: its Host-minted reservations go, under the fences.
	if err := s.Reservations.ReleaseMintedOf(ctx, tx, org.ID, w.UID); err != nil {
		return ownership.Response{}, err
	}
	if w, err = lockWorker(ctx, q, org.ID, &w.UID, deleting.Space, deleting.Name); err != nil {
		return ownership.Response{}, err
	}
	return ownership.Answer(false, w.Project("").JSON(), uuid.Nil), nil
}

// lockCallees locks the workers a caller binds to, with the caller itself when it exists, in UID
// order (the one order every put takes, so that two callers binding to each other never
// deadlock), and checks each callee: this organization's and present (another organization's UID
// is not found, and the answer says nothing more), not being deleted, on the caller's
// installation, and not under a colliding v1 script name (SPEC 3.6). The locks hold until the
// transaction ends, so a callee's delete either sees the caller's binding or waits and the binding
// finds it deleting.
func lockCallees(ctx context.Context, q *dbsqlc.Queries, org string, caller *uuid.UUID, installation string, bindings map[string]string) (callees, error) {
	if len(bindings) == 0 {
		return callees{}, nil
	}
	out := callees{names: slices.Sorted(maps.Keys(bindings)), scripts: make(map[string]string, len(bindings))}
	uids := make([]uuid.UUID, 0, len(bindings)+1)
	if caller != nil {
		uids = append(uids, *caller)
	}
	for _, name := range out.names {
		u := uuid.MustParse(bindings[name]) // validateWorker checked that each is a UID
		out.uids = append(out.uids, u)
		uids = append(uids, u)
	}
	if err := q.WorkersLockForBinding(ctx, dbsqlc.WorkersLockForBindingParams{OrganizationID: org, Uids: uids}); err != nil {
		return callees{}, fmt.Errorf("resource: lock callees: %w", err)
	}
	rows, err := q.WorkersForBinding(ctx, dbsqlc.WorkersForBindingParams{OrganizationID: org, Uids: uids})
	if err != nil {
		return callees{}, fmt.Errorf("resource: read callees: %w", err)
	}
	found := make(map[uuid.UUID]dbsqlc.WorkersForBindingRow, len(rows))
	for _, r := range rows {
		found[r.UID] = r
	}
	for i, name := range out.names {
		u := out.uids[i]
		r, ok := found[u]
		if caller != nil && u == *caller {
			out.scripts[name] = r.ScriptName
			continue // a worker may call itself
		}
		switch {
		case !ok || !r.Present: // a deleted worker is not present
			return callees{}, apierr.New(apierr.NotFound, "serviceBindings %s: no worker %s", name, u)
		case r.Status == dbsqlc.ResourceStatusDeleting:
			return callees{}, apierr.New(apierr.Conflict, "serviceBindings %s: worker %s is being deleted", name, u)
		case r.Installation != installation:
			return callees{}, apierr.New(apierr.InvalidRequest, "serviceBindings %s: worker %s runs on installation %s; a service binding reaches only workers on the caller's installation (%s)", name, u, r.Installation, installation)
		case r.ScriptCollision:
			// Its v1 script name is an earlier worker's (SPEC 3.4), and a Cloudflare binding names
			// the callee's script: it would reach that earlier worker.
			return callees{}, apierr.New(apierr.ScriptHeld, "serviceBindings %s: worker %s runs under a v1 script name an earlier worker holds, so a binding cannot name it; replace that worker (destroy and create it again) to get a v2 name", name, u)
		}
		out.scripts[name] = r.ScriptName
	}
	return out, nil
}

// addBindings adds the bindings of a caller's new generation to the index its callees' deletes
// read, beside those of the generation still deployed: until the new one is deployed either may
// run, so a callee of either stays protected (a failed update that dropped a binding does not free
// the callee the running deployment still calls). keepBindings drops the old ones once the new
// generation is deployed.
func addBindings(ctx context.Context, q *dbsqlc.Queries, caller uuid.UUID, c callees) error {
	if len(c.names) == 0 {
		return nil
	}
	if err := q.ServiceBindingsAdd(ctx, dbsqlc.ServiceBindingsAddParams{CallerUID: caller, Bindings: c.names, Callees: c.uids}); err != nil {
		return fmt.Errorf("resource: save service bindings: %w", err)
	}
	return nil
}

// keepBindings leaves in the index only the bindings of the caller's generation now deployed.
func keepBindings(ctx context.Context, q *dbsqlc.Queries, caller uuid.UUID, c callees) error {
	if err := q.ServiceBindingsKeepOnly(ctx, dbsqlc.ServiceBindingsKeepOnlyParams{CallerUID: caller, Bindings: c.names, Callees: c.uids}); err != nil {
		return fmt.Errorf("resource: prune service bindings: %w", err)
	}
	return nil
}
