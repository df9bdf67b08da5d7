package provider

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/mapvalidator"
	"github.com/hashicorp/terraform-plugin-framework-validators/setvalidator"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/identityschema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

var (
	_ resource.ResourceWithConfigure      = (*workerResource)(nil)
	_ resource.ResourceWithModifyPlan     = (*workerResource)(nil)
	_ resource.ResourceWithValidateConfig = (*workerResource)(nil)
	_ resource.ResourceWithImportState    = (*workerResource)(nil)
	_ resource.ResourceWithIdentity       = (*workerResource)(nil)
)

func newWorkerResource() resource.Resource { return &workerResource{} }

// workerResource is takoform_worker: an ES-module bundle and its declared secret bindings.
type workerResource struct {
	client    *client.Client
	bindings  *planned[[]string]
	offerings *offeringsMemo
	workers   *planned[string]
}

type workerModel struct {
	ID                    types.String   `tfsdk:"id"`
	Space                 types.String   `tfsdk:"space"`
	Name                  types.String   `tfsdk:"name"`
	MainModule            types.String   `tfsdk:"main_module"`
	Modules               types.Map      `tfsdk:"modules"`
	ModuleFiles           types.Map      `tfsdk:"module_files"`
	ModuleSHA256          types.Map      `tfsdk:"module_sha256"`
	BundleBytes           types.Int64    `tfsdk:"bundle_bytes"`
	CompatibilityDate     types.String   `tfsdk:"compatibility_date"`
	Vars                  types.Map      `tfsdk:"vars"`
	JSONVars              types.Map      `tfsdk:"json_vars"`
	CompatibilityFlags    types.Set      `tfsdk:"compatibility_flags"`
	Crons                 types.Set      `tfsdk:"crons"`
	ServiceBindings       types.Map      `tfsdk:"service_bindings"`
	ServiceBindingWorkers types.Map      `tfsdk:"service_binding_workers"`
	Limits                types.Object   `tfsdk:"limits"`
	RequiredSensitiveVars types.Set      `tfsdk:"required_sensitive_vars"`
	RuntimeInputReference types.String   `tfsdk:"runtime_input_reference"`
	OfferingID            types.String   `tfsdk:"offering_id"`
	Revision              types.Int64    `tfsdk:"revision"`
	Generation            types.Int64    `tfsdk:"generation"`
	ScriptName            types.String   `tfsdk:"script_name"`
	Ready                 types.Bool     `tfsdk:"ready"`
	LogsURL               types.String   `tfsdk:"logs_url"`
	Timeouts              timeouts.Value `tfsdk:"timeouts"`
}

type spaceNameIdentityModel struct {
	Space types.String `tfsdk:"space"`
	Name  types.String `tfsdk:"name"`
}

func spaceNameIdentitySchema(what string) identityschema.Schema {
	return identityschema.Schema{
		Attributes: map[string]identityschema.Attribute{
			"space": identityschema.StringAttribute{RequiredForImport: true, Description: "Space of the " + what + "."},
			"name":  identityschema.StringAttribute{RequiredForImport: true, Description: "Name of the " + what + "."},
		},
	}
}

// bundleAttribute is the attribute that holds the bundle: module_files when it is set, else modules.
func bundleAttribute(m workerModel) path.Path {
	if !m.ModuleFiles.IsNull() {
		return path.Root("module_files")
	}
	return path.Root("modules")
}

// MaxBundleBytes is the most a worker's inline modules may hold together (the state and the plan
// hold them, SPEC 3.6); module_files may reach the offering's maxBundleBytes.
const MaxBundleBytes = 1<<20 - 16<<10

// ValidateConfig checks at plan time, all at once and by HCL name, what the Host would refuse at
// apply: not exactly one of modules and module_files (checked here, on the model already read,
// rather than by a schema validator that looks both attributes up by path on every plan), a
// main_module that is not one of the modules, a compatibility_date that is not a date or
// is in the future, and a bundle over the request limit.
func (r *workerResource) ValidateConfig(ctx context.Context, req resource.ValidateConfigRequest, resp *resource.ValidateConfigResponse) {
	var m workerModel
	resp.Diagnostics.Append(getConfig(ctx, req.Config, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if !m.Modules.IsUnknown() && !m.ModuleFiles.IsUnknown() && m.Modules.IsNull() == m.ModuleFiles.IsNull() {
		detail := "modules and module_files are both set; set exactly one of them: modules holds the sources inline, module_files names their files."
		if m.Modules.IsNull() {
			detail = "Neither modules nor module_files is set; set exactly one of them: modules holds the sources inline, module_files names their files."
		}
		resp.Diagnostics.AddAttributeError(path.Root("modules"), "Invalid Attribute Combination", detail)
	}
	modules, known, diags := bundle(ctx, m.Modules, m.ModuleFiles)
	resp.Diagnostics.Append(diags...)
	if known {
		if size := bundleSize(modules); size > MaxBundleBytes && m.ModuleFiles.IsNull() {
			resp.Diagnostics.AddAttributeError(path.Root("modules"), "Bundle too large for inline modules",
				fmt.Sprintf("The modules hold %d bytes together; inline modules may hold at most %d (the state and the plan hold them). "+
					"Give the bundle as module_files instead: it may reach the offering's maxBundleBytes (10 MiB by default).", size, MaxBundleBytes))
		}
		for _, name := range slices.Sorted(maps.Keys(modules)) {
			if _, err := workerconf.ModuleBytes(name, modules[name]); err != nil {
				resp.Diagnostics.AddAttributeError(bundleAttribute(m).AtMapKey(name), "Invalid bytes module", err.Error())
			}
			if _, ok := workerconf.SourceMapOf(name); ok {
				if err := workerconf.CheckSourceMap(modules, name); err != nil {
					resp.Diagnostics.AddAttributeError(bundleAttribute(m).AtMapKey(name), "Invalid source map", err.Error())
				}
			}
		}
		if !m.MainModule.IsUnknown() && !m.MainModule.IsNull() {
			if _, ok := modules[m.MainModule.ValueString()]; !ok {
				resp.Diagnostics.AddAttributeError(path.Root("main_module"), "main_module is not one of the modules",
					fmt.Sprintf("main_module %q names no module (%s).", m.MainModule.ValueString(), strings.Join(slices.Sorted(maps.Keys(modules)), ", ")))
			} else if kind := workerconf.ModuleKind(m.MainModule.ValueString()); kind != workerconf.ModuleJS {
				resp.Diagnostics.AddAttributeError(path.Root("main_module"), "main_module is not code",
					fmt.Sprintf("main_module %q is a %s module; the main module is the worker's ES module code, which imports the others.", m.MainModule.ValueString(), kind))
			}
		}
	}
	r.validateSettings(ctx, m, &resp.Diagnostics)
	if !m.CompatibilityDate.IsUnknown() && !m.CompatibilityDate.IsNull() {
		date, err := time.Parse(time.DateOnly, m.CompatibilityDate.ValueString())
		switch {
		case err != nil:
			resp.Diagnostics.AddAttributeError(path.Root("compatibility_date"), "Invalid compatibility_date",
				fmt.Sprintf("compatibility_date %q is not a date such as 2025-01-01.", m.CompatibilityDate.ValueString()))
		case date.After(time.Now().UTC().AddDate(0, 0, 1)):
			resp.Diagnostics.AddAttributeError(path.Root("compatibility_date"), "compatibility_date in the future",
				fmt.Sprintf("compatibility_date %s has not come yet; no runtime knows its behaviour. Use today's date or an earlier one.", m.CompatibilityDate.ValueString()))
		}
	}
}

func (r *workerResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker"
}

func (r *workerResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "A worker: an ES-module bundle, run by the offering's backend, with the names of the secrets it requires. " +
			"Create and update return once the worker is Ready (its current generation deployed and, when it requires secrets, its runtime input delivered to it).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The worker's UID. A replaced worker has a new one; `takoform_worker_endpoint.worker_id` follows it so that the endpoint is replaced with it.",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"space": schema.StringAttribute{
				MarkdownDescription: "Space of the worker.", Required: true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"name": schema.StringAttribute{
				MarkdownDescription: "Name of the worker, unique in its space.", Required: true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"main_module": schema.StringAttribute{
				MarkdownDescription: "Name of the entry module; one of `modules`. Changes in place.", Required: true,
			},
			"modules": schema.MapAttribute{
				MarkdownDescription: "The bundle inline: 1 to 64 modules, source text by module name; exactly one of `modules` and `module_files`. The plan prints inline sources; `module_files` keeps them out of it. " +
					"A name ending in `.json` is a JSON module and one ending in `.txt` a text module; one ending in `.wasm` is a WebAssembly module (the code imports a compiled `WebAssembly.Module`) and one ending in `.bin` a data module (imported as an `ArrayBuffer`): their values are the bytes in standard base64 (`filebase64(\"add.wasm\")`); `module_files` reads such files as bytes. A name ending in `.map` is the source map of the module it names (`index.js.map` for `index.js`, at most 2 MiB, not counted as code, never loaded into the isolate): on a selfhost offering the worker's log then names original files and lines; other offerings refuse it at plan. Every other module is an ES module; the main module must be one. There are no CommonJS modules. " +
					"Names and sources together may hold at most 1032192 bytes (1 MiB less 16 KiB: the Host takes a request body of at most 1 MiB, and the bundle travels in one); a larger bundle fails at plan. Changes in place (a new generation).",
				Optional:    true,
				ElementType: types.StringType,
				Validators:  []validator.Map{mapvalidator.SizeBetween(1, 64)}, // exactly one of the two: ValidateConfig
			},
			"module_files": schema.MapAttribute{
				MarkdownDescription: "The bundle from files: 1 to 64 modules, the path of each module's source by module name (`{ \"index.js\" = \"${path.module}/src/index.js\" }`); exactly one of `modules` and `module_files`. " +
					"The provider reads the files at plan and again at apply: a file changed in between fails the apply (the CLI reports module_sha256 inconsistent with the plan), and nothing is deployed; plan again. The plan shows the paths and `module_sha256`, never the sources. " +
					"Module types and the size limit are those of `modules` (a `.wasm` or `.bin` file is read as bytes and counts base64-encoded). Changes in place (a new generation) when a file's content changes. " +
					"The Host keeps the paths as given (at most 1024 bytes each) and never reads them, so that importing the worker into a `module_files` configuration plans no change; a change of paths alone updates them in place and deploys nothing. A refresh reads only the modules' digests from the Host, not the sources.",
				Optional:    true,
				ElementType: types.StringType,
				Validators:  []validator.Map{mapvalidator.SizeBetween(1, 64), mapvalidator.ValueStringsAre(stringvalidator.LengthBetween(1, 1024))},
			},
			"module_sha256": schema.MapAttribute{
				MarkdownDescription: "Each module's content digest by module name (hex SHA-256, what `filesha256()` gives for a module file, a `.wasm` or `.bin` file's bytes included), known at plan: the plan shows which module changed.",
				Computed:            true,
				ElementType:         types.StringType,
			},
			"bundle_bytes": schema.Int64Attribute{
				MarkdownDescription: "The size of the bundle (module names and sources), known at plan. At most 1032192.",
				Computed:            true,
			},
			"compatibility_date": schema.StringAttribute{
				MarkdownDescription: "Workers runtime compatibility date, `YYYY-MM-DD`. Changes in place.",
				Required:            true,
				Validators:          []validator.String{stringvalidator.RegexMatches(vocab.Date, "must be a date such as 2025-01-01")},
			},
			"vars": schema.MapAttribute{
				MarkdownDescription: "Plain-text variables by binding name: the worker reads `env.NAME` as a string. They are configuration, not secrets: the plan and the state show them (secrets go in a runtime input). " +
					"Names are binding names (a letter or `_`, then letters, digits or `_`), unique across `vars`, `json_vars` and `required_sensitive_vars`, none starting with `TAKOFORM_`; at most 128 variables in all, each value at most 5120 bytes. " +
					"Changes in place (a new generation; delivered secrets stay, nothing is re-sealed).",
				Optional:    true,
				ElementType: types.StringType,
			},
			"json_vars": schema.MapAttribute{
				MarkdownDescription: "JSON variables by binding name, each value a JSON text (write `jsonencode({...})`): the worker reads `env.NAME` already parsed. Rules as for `vars`. Changes in place.",
				Optional:            true,
				ElementType:         types.StringType,
			},
			"compatibility_flags": schema.SetAttribute{
				MarkdownDescription: "Compatibility flags beside `compatibility_date` (`nodejs_compat`, …), at most 32. A flag the offering's runtime does not know fails the apply with the runtime's own message, and the worker keeps serving its previous generation. Changes in place.",
				Optional:            true,
				ElementType:         types.StringType,
			},
			"crons": schema.SetAttribute{
				MarkdownDescription: "Cron triggers: each a standard five-field expression (`minute hour day-of-month month day-of-week`, read in UTC; `*/5 * * * *`), at most 16, checked at plan. The worker's `scheduled(event)` handler runs at each tick, with `event.cron` and `event.scheduledTime`. " +
					"On a `selfhost` offering the Host claims each tick once and one Ready node runs it at most once (`cron_delivery = \"at-most-once\"` in `takoform_offerings`); a tick more than 60 s late (no Host running) is recorded missed and not run; the handler's lines and each tick's outcome are in the worker's log. " +
					"On `workers-dev` Cloudflare runs them through its schedules API (`at-least-once`), within the installation's cron ceiling across every organization (`429 quota_exceeded` past it). An offering without `cron_delivery` (`wfp-managed`) refuses crons at plan. Changes in place.",
				Optional:    true,
				ElementType: types.StringType,
			},
			"service_bindings": serviceBindingsAttribute(),
			"service_binding_workers": schema.MapAttribute{
				MarkdownDescription: "The worker each service binding reaches, as `space/name`, so that a plan shows which worker a changed binding names (a UID alone says little). " +
					"Read from the workers this configuration plans and, for others, from the Host by UID; null for one the Host no longer holds.",
				Computed:    true,
				ElementType: types.StringType,
			},
			"limits": limitsAttribute(),
			"required_sensitive_vars": schema.SetAttribute{
				MarkdownDescription: "Names of the secret bindings the worker requires. They must equal the `binding_names` of the runtime input it names. Changes in place.",
				Optional:            true,
				ElementType:         types.StringType,
				Validators: []validator.Set{setvalidator.ValueStringsAre(stringvalidator.RegexMatches(vocab.BindingName,
					"must be a binding name: a letter or _, then letters, digits or _"))},
			},
			"runtime_input_reference": schema.StringAttribute{
				MarkdownDescription: "The `reference` of the `takoform_worker_runtime_input` that carries the worker's secrets; required when `required_sensitive_vars` is set. Changes in place: the worker consumes the new runtime input.",
				Optional:            true,
			},
			"offering_id": schema.StringAttribute{
				MarkdownDescription: "The `module-worker` offering to run on. May be omitted when exactly one is sold to the organization (and then shows the one chosen). Changing it replaces the worker.",
				Optional:            true,
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), stringplanmodifier.RequiresReplace()},
			},
			"revision": schema.Int64Attribute{
				MarkdownDescription: "The worker's revision; sent as `If-Match` on updates, so a stale update never reverts a newer one.", Computed: true,
			},
			"generation": schema.Int64Attribute{
				MarkdownDescription: "The worker's generation: it moves with every change of the bundle, its secrets or its reference.", Computed: true,
			},
			"script_name": schema.StringAttribute{
				MarkdownDescription: "The backend's script name for the worker.",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"ready": schema.BoolAttribute{
				MarkdownDescription: "Whether the worker is Ready, as the Host derives it now.", Computed: true,
			},
			"logs_url": schema.StringAttribute{
				MarkdownDescription: "The URL of the worker's log on the Host: what its `console.*` calls printed and the exceptions it did not catch, as NDJSON, with the values of its secrets removed. Read it with the organization's API key (scope `resources:read`), for example `curl -N -H \"Authorization: Bearer $TAKOFORM_API_KEY\" \"$URL?follow=true\"`; `follow=true` keeps the stream open, and `since` (an RFC 3339 time or a duration such as `10m`) skips older lines. Only workers on a `selfhost` offering keep a log (`keeps_logs` of `takoform_offerings`); elsewhere it is null.",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: true, Delete: true}),
		},
	}
}

func (r *workerResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = spaceNameIdentitySchema("worker")
}

func (r *workerResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
	r.bindings = memoOf(req.ProviderData).bindings
	r.offerings = memoOf(req.ProviderData).offerings
	r.workers = memoOf(req.ProviderData).workers
}

// ModifyPlan plans an update of a worker that does not serve what the state says (its last deploy
// failed, or it is not Ready for another reason), so that the next apply tries again rather than
// reporting no changes; and it refuses, at plan time, a worker that would consume a runtime input
// already delivered to another worker UID (SPEC 4): a new or replaced worker needs a new runtime
// input.
func (r *workerResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() {
		return
	}
	var plan, state workerModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	creating := req.State.Raw.IsNull()
	if !creating {
		resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	}
	if resp.Diagnostics.HasError() {
		return
	}
	proposed := plan
	modules, known, diags := bundle(ctx, plan.Modules, plan.ModuleFiles)
	if resp.Diagnostics.Append(diags...); resp.Diagnostics.HasError() {
		return
	}
	plan.ModuleSHA256, plan.BundleBytes = types.MapUnknown(types.StringType), types.Int64Unknown()
	if known {
		plan.ModuleSHA256, plan.BundleBytes = digests(modules), types.Int64Value(int64(bundleSize(modules)))
		if !plan.ModuleFiles.IsNull() && r.client != nil && !plan.OfferingID.IsUnknown() {
			// From files, a bundle may reach its offering's ceiling: past it, it fails here, at
			// plan, and not at apply.
			if most, ok := r.client.OfferingBundleCeiling(ctx, plan.OfferingID.ValueString()); ok {
				if size := workerconf.BundleBytes(modules); size > most {
					resp.Diagnostics.AddAttributeError(path.Root("module_files"), "Bundle too large",
						fmt.Sprintf("The module files hold %d bytes together (names and contents); the worker's offering takes a bundle of at most %d (maxBundleBytes, shown by takoform_offerings).", size, most))
					return
				}
			}
		}
		if !plan.Crons.IsNull() && !plan.Crons.IsUnknown() && len(plan.Crons.Elements()) > 0 && r.client != nil && !plan.OfferingID.IsUnknown() {
			if delivery, ok := r.client.OfferingCronDelivery(ctx, plan.OfferingID.ValueString()); ok && delivery == "" {
				resp.Diagnostics.AddAttributeError(path.Root("crons"), "Crons not run on this offering",
					"This worker's offering runs no cron triggers (its cron_delivery in takoform_offerings is null: wfp-managed has no schedules API for its scripts). Leave crons out, or choose an offering that has them.")
				return
			}
		}
		if workerconf.HasSourceMaps(modules) && r.client != nil && !plan.OfferingID.IsUnknown() {
			// A source map names original places in the worker's log: only an offering that keeps
			// one takes it (SPEC 3.6).
			if keeps, ok := r.client.OfferingKeepsLogs(ctx, plan.OfferingID.ValueString()); ok && !keeps {
				resp.Diagnostics.AddAttributeError(bundleAttribute(plan), "Source maps not kept on this offering",
					"The bundle carries a source map (a .map module), which only a selfhost offering keeps: it names original files and lines in the worker's log, and this worker's offering keeps no log. Leave the .map files out of the bundle.")
				return
			}
		}
	}
	if redeploys(creating, plan.ModuleSHA256, state.ModuleSHA256, state.Ready) {
		plan.Ready, plan.Revision, plan.Generation = types.BoolUnknown(), types.Int64Unknown(), types.Int64Unknown()
	}
	if !creating && !state.ID.IsNull() && !state.ID.IsUnknown() {
		r.workers.record(state.ID.ValueString(), state.Space.ValueString()+"/"+state.Name.ValueString())
	}
	r.learnCallees(ctx, plan.ServiceBindings, state.ServiceBindings)
	plan.ServiceBindingWorkers = r.bindingWorkers(plan.ServiceBindings, state.ServiceBindings, state.ServiceBindingWorkers, true)
	resp.Diagnostics.Append(writePlan(ctx, resp, &proposed, &plan)...)
	r.checkCeilings(ctx, plan, &resp.Diagnostics)
	if r.client == nil || plan.RuntimeInputReference.IsNull() || plan.RuntimeInputReference.IsUnknown() {
		return
	}
	reference := plan.RuntimeInputReference.ValueString()
	if names, ok := r.bindings.lookup(reference); ok {
		// The runtime input is planned in this same plan: what it seals is known now.
		r.requireBound(ctx, plan, reference, names, &resp.Diagnostics)
	}
	if !creating && plan.RuntimeInputReference.Equal(state.RuntimeInputReference) {
		return // consumed already by this worker
	}
	p, err := r.client.GetPreparationByReference(ctx, reference)
	if client.IsNotFound(err) {
		return // prepared later in this apply
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read the worker's runtime input", err)
		return
	}
	if _, planned := r.bindings.lookup(reference); !planned {
		r.requireBound(ctx, plan, reference, p.BindingNames, &resp.Diagnostics)
	}
	if p.BoundWorker != nil && (creating || p.BoundWorker.UID != state.ID.ValueString()) {
		resp.Diagnostics.AddAttributeError(path.Root("runtime_input_reference"), "Runtime input delivered to another worker",
			fmt.Sprintf("The runtime input %s (operation id %s) was delivered to worker UID %s. A runtime input is delivered once, to one worker UID, "+
				"so a new or replaced worker needs a new runtime input: replace the takoform_worker_runtime_input too "+
				"(`terraform apply -replace=<its address>` or `tofu apply -replace=<its address>`, together with the worker's), or bump its bindings_wo_version. "+
				"Through the shipped module (examples/modules/worker), replace the worker with its runtime input in one flag: `-replace=module.<name>.terraform_data.replace_worker`.",
				p.RuntimeInputReference, p.OperationID, p.BoundWorker.UID))
	}
}

// redeploys is whether an update of a worker plans a new generation although its configuration
// may read the same, so that Ready, revision and generation are planned unknown and the plan shows
// the update:
//   - a module file whose content changed leaves the configuration as it was; only the digests
//     (planned from the files) say so;
//   - the Host keeps a failed generation's code as the worker's, with the previous deployment
//     still serving: the state would match the configuration while it does not serve, and the
//     apply redeploys it.
func redeploys(creating bool, planned, prior types.Map, ready types.Bool) bool {
	if creating {
		return false
	}
	changed := !planned.Equal(prior)
	failed := !ready.IsNull() && !ready.IsUnknown() && !ready.ValueBool()
	return changed || failed
}

func (r *workerResource) spec(ctx context.Context, m workerModel) (client.WorkerSpec, error) {
	spec := client.WorkerSpec{MainModule: m.MainModule.ValueString(), CompatibilityDate: m.CompatibilityDate.ValueString(),
		RuntimeInputReference: strPtr(m.RuntimeInputReference), OfferingID: strPtr(m.OfferingID), RequiredSensitiveVars: []string{}}
	modules, known, d := bundle(ctx, m.Modules, m.ModuleFiles)
	if d.HasError() || !known {
		return spec, fmt.Errorf("modules: %v", d)
	}
	if !m.ModuleSHA256.IsUnknown() && !digests(modules).Equal(m.ModuleSHA256) {
		return spec, fmt.Errorf("a module file changed after the plan was made (module_sha256 no longer matches what the plan showed); run plan again")
	}
	spec.Modules = modules
	if !m.ModuleFiles.IsNull() {
		// The Host keeps the paths and shows them, so that an import into this configuration
		// plans no change; it never reads them.
		if d := m.ModuleFiles.ElementsAs(ctx, &spec.ModuleFiles, false); d.HasError() {
			return spec, fmt.Errorf("module_files: %v", d)
		}
	}
	if !m.RequiredSensitiveVars.IsNull() {
		if d := m.RequiredSensitiveVars.ElementsAs(ctx, &spec.RequiredSensitiveVars, false); d.HasError() {
			return spec, fmt.Errorf("required_sensitive_vars: %v", d)
		}
		slices.Sort(spec.RequiredSensitiveVars)
	}
	settings, err := settingsOf(ctx, m)
	if err != nil {
		return spec, err
	}
	spec.Vars, spec.JSONVars, spec.CompatibilityFlags, spec.Crons = settings.Vars, settings.JSONVars, settings.CompatibilityFlags, settings.Crons
	if spec.ServiceBindings, spec.Limits, err = bindingsOf(ctx, m); err != nil {
		return spec, err
	}
	return spec, nil
}

func (r *workerResource) fill(ctx context.Context, m *workerModel, w client.Worker, importing bool) {
	m.ID, m.Space, m.Name = types.StringValue(w.UID), types.StringValue(w.Space), types.StringValue(w.Name)
	m.MainModule, m.CompatibilityDate = types.StringValue(w.MainModule), types.StringValue(w.CompatibilityDate)
	if m.ModuleFiles.IsNull() || m.ModuleFiles.IsUnknown() {
		// From files, the state keeps the paths; the digests say what the Host holds. Where the
		// state has no paths (an import, or inline modules), the Host's say how the worker was
		// last put: from files, the state takes the paths and not the sources, so that an import
		// into a module_files configuration plans no change and prints no source.
		if len(w.ModuleFiles) > 0 {
			m.ModuleFiles, _ = types.MapValueFrom(ctx, types.StringType, w.ModuleFiles)
			m.Modules = types.MapNull(types.StringType)
		} else {
			m.Modules, _ = types.MapValueFrom(ctx, types.StringType, w.Modules)
			m.ModuleFiles = types.MapNull(types.StringType)
		}
	}
	m.ModuleSHA256, m.BundleBytes = digests(w.Modules), types.Int64Value(int64(bundleSize(w.Modules)))
	if w.ModuleSha256 != nil && w.BundleBytes != nil {
		// A read of digests: the Host computed them, as digests() does.
		m.ModuleSHA256, _ = types.MapValueFrom(ctx, types.StringType, w.ModuleSha256)
		m.BundleBytes = types.Int64Value(*w.BundleBytes)
	}
	if len(w.RequiredSensitiveVars) == 0 && (importing || m.RequiredSensitiveVars.IsNull() || m.RequiredSensitiveVars.IsUnknown()) {
		m.RequiredSensitiveVars = types.SetNull(types.StringType)
	} else {
		m.RequiredSensitiveVars, _ = types.SetValueFrom(ctx, types.StringType, w.RequiredSensitiveVars)
	}
	m.Vars = mapOrNull(ctx, w.Vars, importing || m.Vars.IsNull() || m.Vars.IsUnknown())
	m.JSONVars = mapOrNull(ctx, w.JSONVars, importing || m.JSONVars.IsNull() || m.JSONVars.IsUnknown())
	if len(w.CompatibilityFlags) == 0 && (importing || m.CompatibilityFlags.IsNull() || m.CompatibilityFlags.IsUnknown()) {
		m.CompatibilityFlags = types.SetNull(types.StringType)
	} else {
		m.CompatibilityFlags, _ = types.SetValueFrom(ctx, types.StringType, w.CompatibilityFlags)
	}
	if len(w.Crons) == 0 && (importing || m.Crons.IsNull() || m.Crons.IsUnknown()) {
		m.Crons = types.SetNull(types.StringType)
	} else {
		m.Crons, _ = types.SetValueFrom(ctx, types.StringType, w.Crons)
	}
	priorBindings, priorWorkers := m.ServiceBindings, m.ServiceBindingWorkers
	fillBindings(ctx, m, w, importing)
	r.workers.record(w.UID, w.Space+"/"+w.Name)
	m.ServiceBindingWorkers = r.bindingWorkers(m.ServiceBindings, priorBindings, priorWorkers, false)
	m.RuntimeInputReference = types.StringNull()
	if w.RuntimeInputs != nil {
		m.RuntimeInputReference = types.StringValue(w.RuntimeInputs.Reference)
	}
	m.OfferingID = types.StringValue(w.OfferingID)
	m.Revision, m.Generation = types.Int64Value(w.Revision), types.Int64Value(w.Generation)
	m.ScriptName, m.Ready = types.StringValue(w.ScriptName), types.BoolValue(w.Ready)
	m.LogsURL = r.logsURL(ctx, w.OfferingID, w.Space, w.Name)
}

// logsURL is the worker's log route on the Host, or null where its offering keeps no log (the
// Cloudflare packs, SPEC 4). When the offerings cannot be read, the route is given: reading it
// then says why.
func (r *workerResource) logsURL(ctx context.Context, offering, space, name string) types.String {
	if keeps, ok := r.client.OfferingKeepsLogs(ctx, offering); ok && !keeps {
		return types.StringNull()
	}
	return types.StringValue(r.client.WorkerLogsURL(space, name))
}

// reader is how a worker whose configuration is m is read: its digests only when its sources are
// files (the state keeps paths and digests, never sources), else whole.
func (r *workerResource) reader(m workerModel) func(ctx context.Context, space, name string) (client.Worker, error) {
	if !m.ModuleFiles.IsNull() && !m.ModuleFiles.IsUnknown() {
		return r.client.GetWorkerDigests
	}
	return r.client.GetWorker
}

// waitReady polls the worker until it is Ready at generation (or later), or ctx ends; read is
// r.reader of its configuration.
func (r *workerResource) waitReady(ctx context.Context, space, name string, w client.Worker, read func(context.Context, string, string) (client.Worker, error)) (client.Worker, error) {
	if w.Ready {
		return w, nil
	}
	err := waitFor(ctx, func() (bool, string, error) {
		got, err := read(ctx, space, name)
		if err != nil {
			return false, "", err
		}
		w = got
		waiting := "worker " + space + "/" + name + " is not Ready: " + conditionsText(got.Conditions)
		if !got.Ready && stuck(got) {
			return false, "", fmt.Errorf("%s; this does not clear by waiting", waiting)
		}
		return got.Ready, waiting, nil
	})
	return w, err
}

// stuck reports a worker that will not become Ready by itself: its deployment failed, or its
// runtime input can no longer be delivered to it.
func stuck(w client.Worker) bool {
	inputPending := false
	for _, c := range w.Conditions {
		if c.Type == "Ready" && c.Reason == "DeploymentFailed" {
			return true
		}
		inputPending = inputPending || c.Type == "Ready" && c.Reason == "RuntimeInputPending"
	}
	if w.RuntimeInputs != nil {
		switch w.RuntimeInputs.Status {
		case "failed", "expired", "aborted", "missing":
			return true // gone: it can never be delivered
		case "settled":
			return inputPending // settled, but for another worker UID
		}
	}
	return false
}

func (r *workerResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan workerModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	spec, err := r.spec(ctx, plan)
	if err == nil {
		err = r.client.RequireOwnership(ctx)
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to create worker", err)
		return
	}
	space, name := plan.Space.ValueString(), plan.Name.ValueString()
	token := newToken()
	w, _, err := r.client.PutWorker(ctx, space, name, token, 0, spec)
	if err == nil {
		w, err = r.waitReady(ctx, space, name, w, r.reader(plan))
	}
	if err != nil {
		if isUnknownOutcome(err) || w.UID != "" {
			// Keep the token (and what is known) so that the next apply deletes or replaces
			// exactly this object: never an orphan, never a duplicate.
			plan.ID, plan.ScriptName = stringOrNull(nonEmpty(w.UID)), stringOrNull(nonEmpty(w.ScriptName))
			plan.Revision, plan.Generation, plan.Ready = types.Int64Value(w.Revision), types.Int64Value(w.Generation), types.BoolValue(false)
			plan.OfferingID = nullIfUnknown(plan.OfferingID)
			plan.LogsURL = r.logsURL(ctx, w.OfferingID, space, name)
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to create worker", err)
		return
	}
	r.fill(ctx, &plan, w, false)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, spaceNameIdentityModel{Space: plan.Space, Name: plan.Name})...)
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func (r *workerResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state workerModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The identity is set first: terraform before 1.12 keeps none, and the framework wants one even
	// from a Read that removes the resource.
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, spaceNameIdentityModel{Space: state.Space, Name: state.Name})...)
	importing := state.MainModule.IsNull()
	// From files the state keeps paths and digests, never sources: the digests are all a refresh
	// needs (a 10 MiB bundle is about 13 MiB of JSON otherwise). An import reads everything.
	read := r.reader(state)
	if importing {
		read = r.client.GetWorker
	}
	w, err := read(ctx, state.Space.ValueString(), state.Name.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read worker", err)
		return
	}
	r.fill(ctx, &state, w, importing)
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *workerModel) any { return spaceNameIdentityModel{Space: m.Space, Name: m.Name} })...)
	resp.Diagnostics.Append(adoptToken(ctx, req.Private, resp.Private, w.OwnershipToken)...)
}

func (r *workerResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan, state workerModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Update(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	token, diags := getToken(ctx, req.Private)
	resp.Diagnostics.Append(diags...)
	spec, err := r.spec(ctx, plan)
	if err == nil {
		err = r.client.RequireOwnership(ctx)
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to update worker", err)
		return
	}
	space, name := plan.Space.ValueString(), plan.Name.ValueString()
	w, _, err := r.client.PutWorker(ctx, space, name, token, state.Revision.ValueInt64(), spec)
	if client.IsCode(err, "revision_conflict") {
		// An update interrupted after it landed (the Host stopped before answering) finds the
		// revision moved by its own change when it is retried: that is this apply's success.
		if got, gerr := r.client.GetWorker(ctx, space, name); gerr == nil && landed(got, spec) {
			w, err = got, nil
		}
	}
	if err == nil {
		w, err = r.waitReady(ctx, space, name, w, r.reader(plan))
	}
	if err != nil {
		if client.IsCode(err, "revision_conflict") {
			err = fmt.Errorf("%s\n\nThe worker changed after this plan was made; run plan again", describe(err))
		}
		addError(&resp.Diagnostics, "Unable to update worker", err)
		return
	}
	r.fill(ctx, &plan, w, false)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, spaceNameIdentityModel{Space: plan.Space, Name: plan.Name})...)
}

// requireBound refuses, at plan time, a worker whose required_sensitive_vars differ from the
// binding names of the runtime input it consumes: the Host would refuse it at apply.
func (r *workerResource) requireBound(ctx context.Context, plan workerModel, reference string, bound []string, diags *diag.Diagnostics) {
	if plan.RequiredSensitiveVars.IsUnknown() {
		return
	}
	var required []string
	if !plan.RequiredSensitiveVars.IsNull() && plan.RequiredSensitiveVars.ElementsAs(ctx, &required, false).HasError() {
		return
	}
	want, have := slices.Sorted(slices.Values(required)), slices.Sorted(slices.Values(bound))
	if slices.Equal(want, have) {
		return
	}
	diags.AddAttributeError(path.Root("required_sensitive_vars"), "Secrets the runtime input does not bind",
		fmt.Sprintf("The worker requires %s, but the runtime input it consumes (%s) binds %s. Make required_sensitive_vars equal the "+
			"runtime input's binding names (the keys of its bindings_wo).", listOrNone(want), reference, listOrNone(have)))
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "no secret"
	}
	return "[" + strings.Join(names, ", ") + "]"
}

// landed reports whether the worker the Host holds is the one spec asks for.
func landed(w client.Worker, spec client.WorkerSpec) bool {
	ref := ""
	if w.RuntimeInputs != nil {
		ref = w.RuntimeInputs.Reference
	}
	names := slices.Sorted(slices.Values(w.RequiredSensitiveVars))
	flags := slices.Sorted(slices.Values(spec.CompatibilityFlags))
	return maps.Equal(w.Modules, spec.Modules) && maps.Equal(w.ModuleFiles, spec.ModuleFiles) && w.MainModule == spec.MainModule && w.CompatibilityDate == spec.CompatibilityDate &&
		maps.Equal(w.Vars, spec.Vars) && maps.Equal(w.JSONVars, spec.JSONVars) && slices.Equal(w.CompatibilityFlags, slices.Compact(flags)) &&
		slices.Equal(w.Crons, slices.Compact(slices.Sorted(slices.Values(spec.Crons)))) &&
		slices.Equal(names, spec.RequiredSensitiveVars) && ref == deref(spec.RuntimeInputReference)
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Delete deletes the worker. It waits out an unexpired runtime-input claim (it settles or expires);
// an endpoint still standing on the worker is a diagnostic naming it.
func (r *workerResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state workerModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to delete worker", err)
		return
	}
	space, name := state.Space.ValueString(), state.Name.ValueString()
	token, gone, diags := deleteToken(ctx, req.Private, "Unable to delete worker", fmt.Sprintf("worker %s/%s", space, name),
		func(ctx context.Context) (client.Worker, error) { return r.client.GetWorkerDigests(ctx, space, name) },
		func(x client.Worker) *string { return x.OwnershipToken })
	resp.Diagnostics.Append(diags...)
	if gone || resp.Diagnostics.HasError() {
		return
	}
	var last error
	err := waitFor(ctx, func() (bool, string, error) {
		_, err := r.client.DeleteWorker(ctx, space, name, token)
		switch {
		case err == nil || client.IsNotFound(err):
			return true, "", nil
		case client.IsCode(err, "lease_claimed"):
			last = err
			return false, describe(err), nil
		}
		return false, "", err
	})
	if err != nil {
		if last != nil && ctx.Err() != nil {
			err = last
		}
		if client.IsCode(err, "worker_has_endpoints") {
			err = fmt.Errorf("%s\n\nDestroy the takoform_worker_endpoint resources on this worker first (a configuration that passes the worker's id as their worker_id orders this by itself)", describe(err))
		}
		if client.IsCode(err, "worker_has_callers") {
			err = fmt.Errorf("%s\n\nDestroy the workers that bind to this one first, or remove their service_bindings to it (a configuration that binds with this worker's id orders this by itself)", describe(err))
		}
		addError(&resp.Diagnostics, "Unable to delete worker", err)
	}
}

// ImportState takes `space/name` or an identity.
func (r *workerResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importSpaceName(ctx, req, resp, "worker")
}

// importSpaceName is the import of the resources whose id is `space/name`.
func importSpaceName(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse, what string) {
	var space, name string
	if req.ID != "" {
		s, n, ok := strings.Cut(req.ID, "/")
		if !ok || !vocab.Name.MatchString(s) || !vocab.Name.MatchString(n) {
			resp.Diagnostics.AddError("Unable to import "+what, fmt.Sprintf("The import id %q must be space/name.", req.ID))
			return
		}
		space, name = s, n
	} else {
		var id spaceNameIdentityModel
		resp.Diagnostics.Append(getIdentity(ctx, *req.Identity, &id)...)
		if resp.Diagnostics.HasError() {
			return
		}
		space, name = id.Space.ValueString(), id.Name.ValueString()
	}
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("space"), space)...)
	resp.Diagnostics.Append(resp.State.SetAttribute(ctx, path.Root("name"), name)...)
	if resp.Identity != nil {
		resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, spaceNameIdentityModel{Space: types.StringValue(space), Name: types.StringValue(name)})...)
	}
}
