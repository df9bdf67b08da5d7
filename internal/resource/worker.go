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

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/reservation"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeinput"
	"github.com/takoform/terraform-provider-takoform/internal/store"
	"github.com/takoform/terraform-provider-takoform/internal/wire"
)

// Bounds on a worker bundle.
const (
	maxModules     = 64
	maxModuleBytes = 512 << 10
)

var (
	bindingName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	moduleName  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_./-]{0,127}$`)
)

// WorkerSpec is the body of PUT /v1/spaces/{space}/workers/{name}.
type WorkerSpec struct {
	Modules               map[string]string `json:"modules"`
	MainModule            string            `json:"mainModule"`
	CompatibilityDate     string            `json:"compatibilityDate"`
	RequiredSensitiveVars []string          `json:"requiredSensitiveVars"`
	RuntimeInputReference *string           `json:"runtimeInputReference,omitempty"`
	OfferingID            *string           `json:"offeringId,omitempty"`
}

// Worker is one stored worker with its derived deployment state.
type Worker struct {
	UID                   uuid.UUID
	OrganizationID        string
	Space                 string
	Name                  string
	Generation            int64
	Revision              int64
	Modules               map[string]string
	MainModule            string
	CompatibilityDate     string
	RequiredSensitiveVars []string
	RuntimeInputReference *string
	ScriptName            string
	Placement             Placement
	Status                string
	OperationID           uuid.UUID
	// Present is resource_present: false for a row whose create was refused.
	Present            bool
	DeploymentStatus   string
	RuntimeInputStatus *string
}

// Ready is readiness as derived now: live, and the current generation's deployment active.
func (w Worker) Ready() bool { return w.Status == "live" && w.DeploymentStatus == "active" }

// WorkerProjection is the public view of a worker.
type WorkerProjection struct {
	UID               string             `json:"uid"`
	Space             string             `json:"space"`
	Name              string             `json:"name"`
	Generation        int64              `json:"generation"`
	Revision          int64              `json:"revision"`
	Ready             bool               `json:"ready"`
	Conditions        []Condition        `json:"conditions"`
	ScriptName        string             `json:"scriptName"`
	RuntimeInputs     *RuntimeInputsView `json:"runtimeInputs"`
	OwnershipToken    *string            `json:"ownershipToken"`
	MainModule        string             `json:"mainModule"`
	CompatibilityDate string             `json:"compatibilityDate"`
	OfferingID        string             `json:"offeringId"`
}

// RuntimeInputsView is the worker's runtime input: its reference and lease status, never values.
type RuntimeInputsView struct {
	Reference string `json:"reference"`
	Status    string `json:"status"`
}

// Project renders w with its ownership token.
func (w Worker) Project(token string) WorkerProjection {
	p := WorkerProjection{
		UID: w.UID.String(), Space: w.Space, Name: w.Name, Generation: w.Generation, Revision: w.Revision,
		Ready: w.Ready(), Conditions: readyCondition(w.Status, w.DeploymentStatus), ScriptName: w.ScriptName,
		MainModule: w.MainModule, CompatibilityDate: w.CompatibilityDate, OfferingID: w.Placement.OfferingID,
	}
	if w.RuntimeInputReference != nil {
		status := "missing"
		if w.RuntimeInputStatus != nil {
			status = *w.RuntimeInputStatus
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

func validateWorker(space, name string, spec *WorkerSpec) error {
	if !namePattern.MatchString(space) {
		return apierr.New(apierr.InvalidRequest, "space %q must match %s", space, namePattern)
	}
	if !namePattern.MatchString(name) {
		return apierr.New(apierr.InvalidRequest, "worker name %q must match %s", name, namePattern)
	}
	if len(spec.Modules) == 0 || len(spec.Modules) > maxModules {
		return apierr.New(apierr.InvalidRequest, "modules must hold 1 to %d modules", maxModules)
	}
	for n, src := range spec.Modules {
		if !moduleName.MatchString(n) || strings.Contains(n, "..") {
			return apierr.New(apierr.InvalidRequest, "module name %q must match %s", n, moduleName)
		}
		if len(src) > maxModuleBytes {
			return apierr.New(apierr.InvalidRequest, "module %q is larger than %d bytes", n, maxModuleBytes)
		}
	}
	if _, ok := spec.Modules[spec.MainModule]; !ok {
		return apierr.New(apierr.InvalidRequest, "mainModule %q must name one of the modules", spec.MainModule)
	}
	if _, err := time.Parse(time.DateOnly, spec.CompatibilityDate); err != nil {
		return apierr.New(apierr.InvalidRequest, "compatibilityDate %q must be a date such as 2025-01-01", spec.CompatibilityDate)
	}
	seen := map[string]bool{}
	for _, v := range spec.RequiredSensitiveVars {
		if !bindingName.MatchString(v) {
			return apierr.New(apierr.InvalidRequest, "requiredSensitiveVars entry %q must match %s", v, bindingName)
		}
		if seen[v] {
			return apierr.New(apierr.InvalidRequest, "requiredSensitiveVars names %q twice", v)
		}
		seen[v] = true
	}
	spec.RequiredSensitiveVars = append([]string{}, slices.Sorted(maps.Keys(seen))...)
	if len(spec.RequiredSensitiveVars) > 0 && (spec.RuntimeInputReference == nil || *spec.RuntimeInputReference == "") {
		return apierr.New(apierr.InvalidRequest, "the worker requires sensitive vars %s but names no runtimeInputReference", strings.Join(spec.RequiredSensitiveVars, ", "))
	}
	if spec.RuntimeInputReference != nil && *spec.RuntimeInputReference == "" {
		spec.RuntimeInputReference = nil
	}
	return nil
}

// selectOffering resolves the offering a request names (or the only eligible one).
func (s *Service) selectOffering(org auth.Organization, kind string, id *string) (catalog.Offering, catalog.Installation, error) {
	want := ""
	if id != nil {
		want = *id
	}
	o, inst, err := s.Catalog.Select(catalog.Organization{ID: org.ID, Name: org.Name}, kind, want)
	switch {
	case errors.Is(err, catalog.ErrOfferingAmbiguous):
		return o, inst, apierr.New(apierr.OfferingAmbiguous, "%s", strings.TrimPrefix(err.Error(), "offering_ambiguous: "))
	case errors.Is(err, catalog.ErrOfferingUnknown):
		return o, inst, apierr.New(apierr.OfferingUnknown, "%s", strings.TrimPrefix(err.Error(), "offering_unknown: "))
	}
	return o, inst, err
}

func scanWorker(row pgx.Row) (Worker, error) {
	var w Worker
	var modules []byte
	err := row.Scan(&w.UID, &w.OrganizationID, &w.Space, &w.Name, &w.Generation, &w.Revision, &modules, &w.MainModule,
		&w.CompatibilityDate, &w.RequiredSensitiveVars, &w.RuntimeInputReference, &w.ScriptName,
		&w.Placement.OfferingID, &w.Placement.OfferingDigest, &w.Placement.Pack, &w.Placement.Installation,
		&w.Status, &w.OperationID, &w.Present, &w.DeploymentStatus, &w.RuntimeInputStatus)
	if err != nil {
		return w, err
	}
	return w, json.Unmarshal(modules, &w.Modules)
}

// loadWorker reads (and locks) a worker by UID, or the present one named space/name when uid is nil.
func loadWorker(ctx context.Context, tx pgx.Tx, org string, uid *uuid.UUID, space, name string) (Worker, error) {
	w, err := scanWorker(tx.QueryRow(ctx, store.Q("WorkerSelect"), pgx.NamedArgs{"organization_id": org, "uid": uid, "space": space, "name": name}))
	if errors.Is(err, pgx.ErrNoRows) {
		return Worker{}, apierr.New(apierr.NotFound, "no worker %s/%s", space, name)
	}
	if err != nil {
		return Worker{}, fmt.Errorf("resource: load worker: %w", err)
	}
	return w, nil
}

// GetWorker reads the present worker space/name (one whose create was refused is absent).
func (s *Service) GetWorker(ctx context.Context, tx pgx.Tx, org auth.Organization, space, name string) (Worker, error) {
	w, err := loadWorker(ctx, tx, org.ID, nil, space, name)
	if err != nil {
		return Worker{}, err
	}
	if !w.Present {
		return Worker{}, apierr.New(apierr.NotFound, "no worker %s/%s", space, name)
	}
	return w, nil
}

func (w *Worker) save(ctx context.Context, tx pgx.Tx, m *ownership.Mutation) error {
	modules, err := json.Marshal(w.Modules)
	if err != nil {
		return err
	}
	var revision int64
	err = tx.QueryRow(ctx, store.Q("WorkerUpdate"), pgx.NamedArgs{
		"uid": w.UID, "revision": w.Revision, "generation": w.Generation, "modules": modules, "main_module": w.MainModule,
		"compatibility_date": w.CompatibilityDate, "required_sensitive_vars": w.RequiredSensitiveVars,
		"runtime_input_reference": w.RuntimeInputReference, "status": w.Status, "operation_id": m.Operation,
	}).Scan(&revision)
	if errors.Is(err, pgx.ErrNoRows) {
		return apierr.New(apierr.IntentInProgress, "the worker changed during this request; retry")
	}
	if err != nil {
		return fmt.Errorf("resource: save worker: %w", err)
	}
	w.Revision, w.OperationID = revision, m.Operation
	return nil
}

func (w Worker) desired() backend.Desired {
	return backend.Desired{
		Kind: backend.NativeWorker, NativeName: w.ScriptName, ResourceUID: w.UID,
		Bundle: &backend.Bundle{Modules: w.Modules, MainModule: w.MainModule, CompatibilityDate: w.CompatibilityDate},
	}
}

func sameSpec(w Worker, spec WorkerSpec) bool {
	return maps.Equal(w.Modules, spec.Modules) && w.MainModule == spec.MainModule &&
		w.CompatibilityDate == spec.CompatibilityDate && slices.Equal(w.RequiredSensitiveVars, spec.RequiredSensitiveVars) &&
		equalPtr(w.RuntimeInputReference, spec.RuntimeInputReference)
}

func equalPtr(a, b *string) bool {
	return (a == nil && b == nil) || (a != nil && b != nil && *a == *b)
}

// PutWorker creates the worker, resumes its interrupted create, or applies a changed spec as a
// new generation. It returns the worker and whether this request created it.
func (s *Service) PutWorker(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string, spec WorkerSpec) (Worker, bool, error) {
	if err := validateWorker(space, name, &spec); err != nil {
		return Worker{}, false, err
	}
	offering, _, err := s.selectOffering(org, catalog.KindWorker, spec.OfferingID)
	if err != nil {
		return Worker{}, false, err
	}
	placement := placementOf(offering)
	mut, err := s.mutator(placement)
	if err != nil {
		return Worker{}, false, err
	}
	var w Worker
	var work *planned
	created := m.Current == nil || m.Current.Pending
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		if m.Current == nil {
			w = Worker{
				UID: uuid.New(), OrganizationID: org.ID, Space: space, Name: name, Generation: 1, Revision: 1,
				Modules: spec.Modules, MainModule: spec.MainModule, CompatibilityDate: spec.CompatibilityDate,
				RequiredSensitiveVars: spec.RequiredSensitiveVars, RuntimeInputReference: spec.RuntimeInputReference,
				Placement: placement, Status: "creating",
				ScriptName: backend.ScriptName(backend.WorkerRef{TenantRef: org.ID, Space: space, Name: name}),
			}
			modules, err := json.Marshal(w.Modules)
			if err != nil {
				return err
			}
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			_, err = sp.Exec(ctx, store.Q("WorkerInsert"), pgx.NamedArgs{
				"uid": w.UID, "organization_id": org.ID, "space": space, "name": name, "modules": modules,
				"main_module": w.MainModule, "compatibility_date": w.CompatibilityDate,
				"required_sensitive_vars": w.RequiredSensitiveVars, "runtime_input_reference": w.RuntimeInputReference, "script_name": w.ScriptName,
				"offering_id": placement.OfferingID, "offering_digest": placement.OfferingDigest, "pack": placement.Pack,
				"installation": placement.Installation, "operation_id": m.Operation,
			})
			if store.IsUniqueViolation(err, "workers_live_key") {
				_ = sp.Rollback(ctx)
				return apierr.New(apierr.ResourceExists, "worker %s/%s already exists and is not owned by this token", space, name)
			}
			if err != nil {
				_ = sp.Rollback(ctx)
				return fmt.Errorf("resource: create worker: %w", err)
			}
			if err := sp.Commit(ctx); err != nil {
				return err
			}
			if err := m.Bind(ctx, tx, w.UID); err != nil {
				return err
			}
			w.OperationID = m.Operation
			pl, err := plan(ctx, tx, m, org.ID, "worker", w.UID, w.Generation, placement, w.desired())
			work = &pl
			return err
		}
		uid := m.Current.UID
		var err error
		if w, err = loadWorker(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		if w.Status == "deleting" || w.Status == "deleted" {
			return apierr.New(apierr.Conflict, "worker %s/%s is being deleted; finish the delete first", space, name)
		}
		if w.Placement.OfferingID != placement.OfferingID || w.Placement.OfferingDigest != placement.OfferingDigest {
			return apierr.New(apierr.PlacementDrift, "worker %s/%s runs on offering %s (digest %.12s); it cannot move to %s (digest %.12s) in place: replace it",
				space, name, w.Placement.OfferingID, w.Placement.OfferingDigest, placement.OfferingID, placement.OfferingDigest)
		}
		changed := !sameSpec(w, spec)
		if changed {
			w.Generation++
			w.Modules, w.MainModule, w.CompatibilityDate, w.RequiredSensitiveVars = spec.Modules, spec.MainModule, spec.CompatibilityDate, spec.RequiredSensitiveVars
			w.RuntimeInputReference = spec.RuntimeInputReference
		}
		if changed || w.DeploymentStatus != "active" || w.Status == "creating" {
			if err := w.save(ctx, tx, m); err != nil {
				return err
			}
		}
		if changed || w.DeploymentStatus != "active" {
			pl, err := plan(ctx, tx, m, org.ID, "worker", w.UID, w.Generation, placement, w.desired())
			work = &pl
			return err
		}
		return nil
	})
	if err != nil {
		return Worker{}, false, err
	}
	if work != nil {
		if err := s.dispatch(ctx, m, mut, *work); err != nil {
			return Worker{}, false, err
		}
	}
	var inc reservation.WorkerIncarnation
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		if w, err = loadWorker(ctx, tx, org.ID, &w.UID, space, name); err != nil {
			return err
		}
		if w.Status == "creating" {
			w.Status = "live"
			if err := w.save(ctx, tx, m); err != nil {
				return err
			}
		}
		if w.RuntimeInputReference != nil && (w.RuntimeInputStatus == nil || *w.RuntimeInputStatus != "settled") {
			_, inc, err = readyWorker(ctx, tx, org.ID, space, name)
		}
		return err
	})
	if err != nil || inc.OrganizationID == "" {
		return w, created, err
	}
	// The deployment is active: the worker consumes its runtime input (SPEC 3.5).
	if s.RuntimeInputs == nil {
		return Worker{}, false, apierr.New(apierr.NotImplemented, "this Host serves no runtime inputs")
	}
	if _, err := s.RuntimeInputs.Consume(ctx, m, runtimeinput.Consumer{
		Incarnation: inc, ScriptName: w.ScriptName, Required: w.RequiredSensitiveVars, Installation: s.Catalog.Installations[w.Placement.Installation],
	}, *w.RuntimeInputReference, s.Hooks); err != nil {
		return Worker{}, false, err
	}
	err = m.Tx(ctx, func(tx pgx.Tx) error {
		var err error
		w, err = loadWorker(ctx, tx, org.ID, &w.UID, space, name)
		return err
	})
	return w, created, err
}

// DeleteWorker deletes the worker the mutation's binding names. It is refused while an endpoint
// still stands on the worker (SPEC 3.3, safe destroy order).
func (s *Service) DeleteWorker(ctx context.Context, m *ownership.Mutation, org auth.Organization, space, name string) (Worker, error) {
	var w Worker
	var work []planned
	uid := m.Current.UID
	err := m.Tx(ctx, func(tx pgx.Tx) error {
		if err := brake(ctx, tx); err != nil {
			return err
		}
		var err error
		if w, err = loadWorker(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		if w.Status == "deleted" {
			return nil
		}
		rows, err := tx.Query(ctx, store.Q("WorkerLiveEndpoints"), pgx.NamedArgs{"worker_uid": w.UID})
		if err != nil {
			return fmt.Errorf("resource: worker endpoints: %w", err)
		}
		endpoints, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("resource: worker endpoints: %w", err)
		}
		if len(endpoints) > 0 {
			return apierr.New(apierr.WorkerHasEndpoints, "worker %s/%s still has endpoints (%s): destroy them first", space, name, strings.Join(endpoints, ", ")).
				With("endpoints", endpoints)
		}
		rows, err = tx.Query(ctx, store.Q("PreparationClaimsOnWorker"), pgx.NamedArgs{"worker_uid": w.UID})
		if err != nil {
			return fmt.Errorf("resource: worker claims: %w", err)
		}
		claims, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return fmt.Errorf("resource: worker claims: %w", err)
		}
		if len(claims) > 0 {
			return apierr.New(apierr.LeaseClaimed, "worker %s/%s holds an unexpired runtime-input claim (%s); its deletion waits until the lease settles, is aborted or expires", space, name, strings.Join(claims, ", "))
		}
		if w.Status != "deleting" {
			w.Status = "deleting"
			if err := w.save(ctx, tx, m); err != nil {
				return err
			}
		}
		work, err = beginDelete(ctx, tx, m, org.ID, "worker", w.UID)
		return err
	})
	if err != nil || w.Status == "deleted" {
		return w, err
	}
	err = s.finishDelete(ctx, m, w.Placement, work, w.UID, func(tx pgx.Tx) error {
		var err error
		if w, err = loadWorker(ctx, tx, org.ID, &uid, space, name); err != nil {
			return err
		}
		w.Status = "deleted"
		return w.save(ctx, tx, m)
	})
	return w, err
}
