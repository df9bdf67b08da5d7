package provider

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/terraform-plugin-framework-validators/int64validator"
	"github.com/hashicorp/terraform-plugin-framework-validators/mapvalidator"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/mapplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-framework/types/basetypes"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// serviceBindingsAttribute is takoform_worker.service_bindings.
func serviceBindingsAttribute() schema.MapAttribute {
	return schema.MapAttribute{
		MarkdownDescription: "Other workers this one calls, by binding name: `{ AUTH = takoform_worker.auth.id }`; the worker calls `env.AUTH.fetch(request)` and reaches that worker's current Ready deployment. " +
			"Each value is a worker UID of the same organization on the same installation (another organization's UID is not found; another installation's is refused). " +
			"Names follow the rules of `vars` and may not repeat a name of `vars`, `json_vars` or `required_sensitive_vars`; at most 32. " +
			"The Host refuses to delete a worker that a live worker binds to (`worker_has_callers`), so destroy removes callers first, as the plan's dependencies order it. " +
			"A binding to another existing worker changes in place; when a bound worker will be replaced (its `id` is unknown in the plan), this worker is replaced with it, so that `-replace` of the callee works in one apply. The callee's code updates never restart this worker.",
		Optional:      true,
		ElementType:   types.StringType,
		Validators:    []validator.Map{mapvalidator.SizeAtMost(32)},
		PlanModifiers: []planmodifier.Map{replaceWhenACalleeIsReplaced()},
	}
}

// replaceWhenACalleeIsReplaced plans the caller's replacement when a binding it already has will
// name a worker UID not known until apply: the callee is being replaced (SPEC 3.6). Updated in
// place, the caller would still bind to the old callee when that one's delete runs, and the Host
// refuses that delete (worker_has_callers); replaced, the caller goes first. A new binding to a
// worker not created yet is added in place: nothing binds to an old UID.
func replaceWhenACalleeIsReplaced() planmodifier.Map {
	return mapplanmodifier.RequiresReplaceIf(func(_ context.Context, req planmodifier.MapRequest, resp *mapplanmodifier.RequiresReplaceIfFuncResponse) {
		resp.RequiresReplace = calleeReplaced(req.StateValue, req.PlanValue)
	}, "Replaced when a bound worker is replaced.", "Replaced when a bound worker is replaced.")
}

// calleeReplaced is the decision: the plan has a value not known until apply, and a UID the
// state binds (under whatever name) is not among the plan's known values, so the unknown one may
// be its replacement (the binding kept its name, or was renamed with it); or the whole map is
// unknown while the state binds some. A UID the plan still names, under any binding, is kept.
func calleeReplaced(state, plan types.Map) bool {
	if state.IsNull() || state.IsUnknown() || len(state.Elements()) == 0 {
		return false
	}
	if plan.IsUnknown() {
		return true
	}
	if plan.IsNull() {
		return false
	}
	known, unknown := map[string]bool{}, false
	for _, now := range plan.Elements() {
		switch s, ok := now.(types.String); {
		case now.IsUnknown():
			unknown = true
		case ok && !s.IsNull():
			known[s.ValueString()] = true
		}
	}
	if !unknown {
		return false
	}
	for _, was := range state.Elements() {
		if s, ok := was.(types.String); ok && !s.IsNull() && !s.IsUnknown() && !known[s.ValueString()] {
			return true
		}
	}
	return false
}

// limitsModel is takoform_worker.limits.
type limitsModel struct {
	CPUMs    types.Int64 `tfsdk:"cpu_ms"`
	MemoryMB types.Int64 `tfsdk:"memory_mb"`
}

var limitsTypes = map[string]attr.Type{"cpu_ms": types.Int64Type, "memory_mb": types.Int64Type}

var objectAsOptions = basetypes.ObjectAsOptions{}

// limitsAttribute is takoform_worker.limits.
func limitsAttribute() schema.SingleNestedAttribute {
	return schema.SingleNestedAttribute{
		MarkdownDescription: "The worker's own limits, within its offering's ceilings (the `takoform_offerings` data source shows them as `max_cpu_ms` and `max_memory_mb`); a value above a ceiling fails at plan. Omitted: the offering's ceilings. Changes in place.",
		Optional:            true,
		Attributes: map[string]schema.Attribute{
			"cpu_ms": schema.Int64Attribute{
				MarkdownDescription: "Milliseconds one request may take. On `selfhost` offerings it bounds the request's wall time at the edge (the client gets `504` past it); on `workers-dev` it is the script's `cpu_ms` limit; on `wfp-managed` the dispatch worker applies it to every request and service binding call (Cloudflare's error past it is a `503` `worker_exceeded_limits` problem).",
				Optional:            true,
				Validators:          []validator.Int64{int64validator.AtLeast(1)},
			},
			"memory_mb": schema.Int64Attribute{
				MarkdownDescription: "Memory ceiling of each of the worker's processes, in MiB, on `selfhost` offerings (a process past it is killed and restarted). Cloudflare offerings run every worker with 128 MB: only 128 is accepted there.",
				Optional:            true,
				Validators:          []validator.Int64{int64validator.AtLeast(workerconf.MinMemoryMB)},
			},
		},
	}
}

// bindingsOf is the configuration's service bindings and limits as the Host takes them.
func bindingsOf(ctx context.Context, m workerModel) (map[string]string, *client.WorkerLimits, error) {
	var bindings map[string]string
	if d := m.ServiceBindings.ElementsAs(ctx, &bindings, false); d.HasError() {
		return nil, nil, fmt.Errorf("service_bindings: %v", d)
	}
	if m.Limits.IsNull() || m.Limits.IsUnknown() {
		return bindings, nil, nil
	}
	var l limitsModel
	if d := m.Limits.As(ctx, &l, objectAsOptions); d.HasError() {
		return nil, nil, fmt.Errorf("limits: %v", d)
	}
	return bindings, &client.WorkerLimits{CPUMs: l.CPUMs.ValueInt64(), MemoryMB: l.MemoryMB.ValueInt64()}, nil
}

// fillBindings sets service_bindings and limits from the Host's worker: null where the Host holds
// none and the configuration gave none, so that an omitted attribute never shows a diff.
func fillBindings(ctx context.Context, m *workerModel, w client.Worker, importing bool) {
	m.ServiceBindings = mapOrNull(ctx, w.ServiceBindings, importing || m.ServiceBindings.IsNull() || m.ServiceBindings.IsUnknown())
	if w.Limits == nil && (importing || m.Limits.IsNull() || m.Limits.IsUnknown()) {
		m.Limits = types.ObjectNull(limitsTypes)
		return
	}
	l := limitsModel{CPUMs: types.Int64Null(), MemoryMB: types.Int64Null()}
	if w.Limits != nil && w.Limits.CPUMs > 0 {
		l.CPUMs = types.Int64Value(w.Limits.CPUMs)
	}
	if w.Limits != nil && w.Limits.MemoryMB > 0 {
		l.MemoryMB = types.Int64Value(w.Limits.MemoryMB)
	}
	m.Limits, _ = types.ObjectValueFrom(ctx, limitsTypes, l)
}

// checkCeilings fails the plan for limits above the ceilings of the offering the worker runs on
// (or the only one it could), as the Host would at apply.
func (r *workerResource) checkCeilings(ctx context.Context, plan workerModel, diags *diag.Diagnostics) {
	if r.client == nil || plan.Limits.IsNull() || plan.Limits.IsUnknown() || plan.OfferingID.IsUnknown() {
		return
	}
	var l limitsModel
	if d := plan.Limits.As(ctx, &l, objectAsOptions); d.HasError() || l.CPUMs.IsUnknown() || l.MemoryMB.IsUnknown() {
		return
	}
	offerings, err := r.offerings.get(ctx, r.client)
	if err != nil {
		addError(diags, "Unable to read the offerings for the worker's limits", err)
		return
	}
	var o *client.Offering
	for i := range offerings {
		c := &offerings[i]
		if c.Kind != "module-worker" {
			continue
		}
		if plan.OfferingID.IsNull() || c.ID == plan.OfferingID.ValueString() {
			if o != nil {
				return // ambiguous: the Host says so at apply
			}
			o = c
		}
	}
	if o == nil || o.Ceilings == nil {
		return
	}
	// The Host's own check, each refusal put on the attribute it names.
	ceilings := workerconf.Ceilings{CPUMs: o.Ceilings.CPUMs, MemoryMB: o.Ceilings.MemoryMB, FixedMemory: o.Ceilings.FixedMemory}
	var refused *workerconf.LimitError
	if !errors.As(ceilings.Check(&workerconf.Limits{CPUMs: l.CPUMs.ValueInt64(), MemoryMB: l.MemoryMB.ValueInt64()}), &refused) {
		return
	}
	at, name := path.Root("limits"), "limits"
	switch refused.Field {
	case "cpuMs":
		at, name = at.AtName("cpu_ms"), "cpu_ms"
	case "memoryMb":
		at, name = at.AtName("memory_mb"), "memory_mb"
	}
	diags.AddAttributeError(at, "Limit outside the offering's ceilings", fmt.Sprintf("%s %s (offering %s).", name, refused.Detail, o.ID))
}

// offeringsMemo reads the Host's offerings once per provider configuration (one plan or apply):
// every worker's plan checks its limits against them. A failed read is not kept.
type offeringsMemo struct {
	mu  sync.Mutex
	got []client.Offering
}

func (m *offeringsMemo) get(ctx context.Context, c *client.Client) ([]client.Offering, error) {
	if m == nil {
		return c.Offerings(ctx)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.got == nil {
		offerings, err := c.Offerings(ctx)
		if err != nil {
			return nil, err
		}
		m.got = offerings
	}
	return m.got, nil
}

// bindingWorkers names the worker each binding reaches, space/name: from the workers this
// configuration planned, read or created, else as it was named before for the same UID. A binding
// whose worker is not known yet is unknown in a plan; in state, one this configuration does not
// hold is null.
func (r *workerResource) bindingWorkers(bindings, priorBindings, priorWorkers types.Map, planning bool) types.Map {
	switch {
	case bindings.IsNull():
		return types.MapNull(types.StringType)
	case bindings.IsUnknown():
		return types.MapUnknown(types.StringType)
	}
	// What each UID was shown as (null: a worker this configuration does not hold), when known.
	before := map[string]types.String{}
	if !priorBindings.IsNull() && !priorBindings.IsUnknown() && !priorWorkers.IsNull() && !priorWorkers.IsUnknown() {
		names := priorWorkers.Elements()
		for k, v := range priorBindings.Elements() {
			uid, ok1 := v.(types.String)
			name, ok2 := names[k].(types.String)
			if ok1 && ok2 && !uid.IsUnknown() && !name.IsUnknown() {
				before[uid.ValueString()] = name
			}
		}
	}
	out := make(map[string]attr.Value, len(bindings.Elements()))
	for k, v := range bindings.Elements() {
		uid, ok := v.(types.String)
		switch {
		case !ok || uid.IsNull():
			out[k] = types.StringNull()
		case uid.IsUnknown():
			out[k] = types.StringUnknown()
		default:
			if name, ok := r.workers.lookup(uid.ValueString()); ok {
				out[k] = types.StringValue(name)
			} else if name, ok := before[uid.ValueString()]; ok {
				out[k] = name
			} else if planning {
				out[k] = types.StringUnknown()
			} else {
				out[k] = types.StringNull()
			}
		}
	}
	return types.MapValueMust(types.StringType, out)
}

// learnCallees asks the Host for the workers a binding newly names that this configuration did
// not plan or read (a worker of another configuration, or one an apply does not plan again), so
// that the plan can name them. A UID the state already binds needs nothing; a failed read leaves
// the name unknown.
func (r *workerResource) learnCallees(ctx context.Context, bindings, priorBindings types.Map) {
	if r.client == nil || bindings.IsNull() || bindings.IsUnknown() {
		return
	}
	bound := map[string]bool{}
	if !priorBindings.IsNull() && !priorBindings.IsUnknown() {
		for _, v := range priorBindings.Elements() {
			if s, ok := v.(types.String); ok && !s.IsUnknown() && !s.IsNull() {
				bound[s.ValueString()] = true
			}
		}
	}
	for _, v := range bindings.Elements() {
		s, ok := v.(types.String)
		if !ok || s.IsUnknown() || s.IsNull() || bound[s.ValueString()] {
			continue
		}
		if _, known := r.workers.lookup(s.ValueString()); known {
			continue
		}
		if w, err := r.client.GetWorkerByUID(ctx, s.ValueString()); err == nil {
			r.workers.record(w.UID, w.Space+"/"+w.Name)
		}
	}
}
