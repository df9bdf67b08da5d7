package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/mapvalidator"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/identityschema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringdefault"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

var (
	_ resource.ResourceWithConfigure   = (*runtimeInputResource)(nil)
	_ resource.ResourceWithModifyPlan  = (*runtimeInputResource)(nil)
	_ resource.ResourceWithImportState = (*runtimeInputResource)(nil)
	_ resource.ResourceWithIdentity    = (*runtimeInputResource)(nil)
)

func newRuntimeInputResource() resource.Resource { return &runtimeInputResource{} }

// runtimeInputResource is takoform_worker_runtime_input: a sealed set of secret bindings for one
// worker, delivered once (SPEC 3.5). The values exist only in the write-only bindings_wo; the
// plan and the state carry the reference, a digest computed in ModifyPlan.
type runtimeInputResource struct {
	client   *client.Client
	bindings *planned[[]string]
}

// runtimeInputModel is the plan and state model. BindingsWO is write-only: the framework always
// holds it null in a plan or state; the values are read from the configuration alone.
type runtimeInputModel struct {
	ID                    types.String   `tfsdk:"id"`
	OperationID           types.String   `tfsdk:"operation_id"`
	Space                 types.String   `tfsdk:"space"`
	WorkerName            types.String   `tfsdk:"worker_name"`
	BundleName            types.String   `tfsdk:"bundle_name"`
	EndpointName          types.String   `tfsdk:"endpoint_name"`
	OriginReservationID   types.String   `tfsdk:"origin_reservation_id"`
	CanonicalPublicOrigin types.String   `tfsdk:"canonical_public_origin"`
	MaterialSetNonce      types.String   `tfsdk:"material_set_nonce"`
	BindingsWO            types.Map      `tfsdk:"bindings_wo"`
	BindingsWOVersion     types.Int64    `tfsdk:"bindings_wo_version"`
	Reference             types.String   `tfsdk:"reference"`
	PreparationID         types.String   `tfsdk:"preparation_id"`
	BindingNames          types.Set      `tfsdk:"binding_names"`
	Status                types.String   `tfsdk:"status"`
	ExpiresAt             types.String   `tfsdk:"expires_at"`
	Timeouts              timeouts.Value `tfsdk:"timeouts"`
}

type runtimeInputIdentityModel struct {
	OperationID types.String `tfsdk:"operation_id"`
}

func (r *runtimeInputResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker_runtime_input"
}

func (r *runtimeInputResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "A sealed set of secret bindings for one worker. The values are given in the write-only `bindings_wo`: " +
			"they travel once to the Host, which seals them, and never enter the plan, the state or a log. The worker consumes the " +
			"runtime input through `takoform_worker.runtime_input_reference`, which is known at plan time. A runtime input never " +
			"changes in place: new values, or a bump of `bindings_wo_version`, replace it and update the worker in place. " +
			"It is delivered once, to one worker UID: a replaced worker needs it replaced too (the plan says so), and one whose " +
			"worker is gone from the Host (`destroy -target`, a deletion outside the configuration) is replaced by the next plan.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The runtime input's id: its `operation_id`, known in the plan whenever that is (so the CLI prints `[id=…]`).",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"operation_id": schema.StringAttribute{
				MarkdownDescription: "Operation id of the preparation, unique in the organization. Defaults to `rip-` and 24 hex digits, known in the plan: derived from the target and `bindings_wo_version`, the first such id the Host does not know yet, so every new incarnation (a replacement, or after an expiry) gets a new one. Leave it unset unless you manage ids yourself.",
				Optional:            true,
				Computed:            true,
				Validators:          []validator.String{stringvalidator.RegexMatches(vocab.OperationID, "must be 1 to 128 characters of letters, digits, ., _ and -, starting with a letter or digit")},
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), stringplanmodifier.RequiresReplace()},
			},
			"space": schema.StringAttribute{
				MarkdownDescription: "Space of the worker that consumes the runtime input.",
				Required:            true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"worker_name": schema.StringAttribute{
				MarkdownDescription: "Name of the worker that consumes the runtime input.",
				Required:            true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"bundle_name": schema.StringAttribute{
				MarkdownDescription: "Bundle the bindings are for. Defaults to `main`.",
				Optional:            true, Computed: true, Default: stringdefault.StaticString("main"), Validators: nameValidators(), PlanModifiers: replace,
			},
			"endpoint_name": schema.StringAttribute{
				MarkdownDescription: "Name of the endpoint the worker publishes on; the reference commits to it.",
				Required:            true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"origin_reservation_id": schema.StringAttribute{
				MarkdownDescription: "The reservation the worker publishes through (a runtime input always names a supplied reservation).",
				Required:            true, Validators: reservationIDValidators(), PlanModifiers: replace,
			},
			"canonical_public_origin": schema.StringAttribute{
				MarkdownDescription: "The reservation's `canonical_origin`. The reference commits to it; the Host takes the origin from the reservation and refuses a mismatch.",
				Required:            true, PlanModifiers: replace,
			},
			"material_set_nonce": schema.StringAttribute{
				MarkdownDescription: "Nonce of the material set. When unset it is derived in the plan with the operation id, and changes whenever `bindings_wo_version` does, so the same values seal under a new reference.",
				Optional:            true, Computed: true, PlanModifiers: replace,
			},
			"bindings_wo": schema.MapAttribute{
				MarkdownDescription: "The secret values, by binding name. **Write-only**: never stored in the plan or the state. The names must equal the consuming worker's `required_sensitive_vars`. Left unset (as in an imported or generated configuration), the prior reference is kept. The values must be the same at plan and at apply: applying a saved plan with other values (an ephemeral variable given anew) fails with the CLI's \"inconsistent final plan\" naming `reference`, which is this rule, not a provider bug, and nothing is sealed.",
				ElementType:         types.StringType,
				Optional:            true,
				WriteOnly:           true,
				Sensitive:           true,
				Validators: []validator.Map{mapvalidator.KeysAre(stringvalidator.RegexMatches(vocab.BindingName,
					"must be a binding name: a letter or _, then letters, digits or _"))},
			},
			"bindings_wo_version": schema.Int64Attribute{
				MarkdownDescription: "Bump it to re-seal the values under a new nonce (rotation): the runtime input is replaced and its worker updated in place.",
				Optional:            true,
			},
			"reference": schema.StringAttribute{
				MarkdownDescription: "The runtime-input reference, `rip2.<commitment secret id>.<preparation_id>.<sha256>`: a digest of the nonce, the target and each value's HMAC under a commitment key the Host gives only to a key that can write, so a plan or state holding it lets nobody test guesses of a value. Known at plan time whenever the values are and the provider's key can write. An input created by an earlier provider keeps its `rip1.<preparation_id>.<sha256>` reference until its values or `bindings_wo_version` change.",
				Computed:            true,
			},
			"preparation_id": schema.StringAttribute{
				MarkdownDescription: "The preparation id, `prep-` and the first 32 hex of the reference's digest.",
				Computed:            true,
			},
			"binding_names": schema.SetAttribute{
				MarkdownDescription: "Names of the bindings (never their values).",
				ElementType:         types.StringType,
				Computed:            true,
			},
			"status": schema.StringAttribute{
				MarkdownDescription: "`prepared`, `claimed`, `dispatched`, `settled` or `failed`. An `expired` or `aborted` runtime input is removed from state on refresh, and the next plan prepares a new one.",
				Computed:            true,
			},
			"expires_at": schema.StringAttribute{
				MarkdownDescription: "When a prepared (or claimed) runtime input expires unless a worker consumes it (RFC 3339).",
				Computed:            true,
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: true, Delete: true}),
		},
	}
}

func (r *runtimeInputResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = identityschema.Schema{
		Attributes: map[string]identityschema.Attribute{
			"operation_id": identityschema.StringAttribute{RequiredForImport: true, Description: "Operation id of the preparation."},
		},
	}
}

func (r *runtimeInputResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
	r.bindings = memoOf(req.ProviderData).bindings
}

// configBindings reads bindings_wo from the configuration alone (write-only values exist nowhere
// else). known is false when the map or any value is unknown.
func configBindings(ctx context.Context, config interface {
	GetAttribute(context.Context, path.Path, any) diag.Diagnostics
}) (values map[string]types.String, isNull, known bool, diags diag.Diagnostics) {
	var m types.Map
	diags = config.GetAttribute(ctx, path.Root("bindings_wo"), &m)
	if diags.HasError() || m.IsNull() {
		return nil, true, true, diags
	}
	if m.IsUnknown() {
		return nil, false, false, diags
	}
	values = map[string]types.String{}
	diags.Append(m.ElementsAs(ctx, &values, false)...)
	known = true
	for _, v := range values {
		known = known && !v.IsUnknown()
	}
	return values, false, known, diags
}

func plainBindings(values map[string]types.String) map[string]string {
	out := make(map[string]string, len(values))
	for k, v := range values {
		out[k] = v.ValueString()
	}
	return out
}

// reference computes a runtime input's reference from its values. A new one is rip2: each value
// committed under the commitment key the Host gives a write key for the nonce, asked for every
// time and kept nowhere (not in state, private state, plan or logs). A that stands (an input an earlier provider created) is kept while the values,
// nonce and target still give it. ok is false when the provider's key may not write, so the Host
// gives no commitment key.
func (r *runtimeInputResource) reference(ctx context.Context, m runtimeInputModel, values map[string]types.String, standing string) (runtimeref.Identity, bool, error) {
	nonce, target, plain := m.MaterialSetNonce.ValueString(), m.target(), plainBindings(values)
	if strings.HasPrefix(standing, "rip1.") {
		if id := runtimeref.Derive(nonce, target, plain); id.Reference == standing {
			id.Canonical = nil
			return id, true, nil
		}
	}
	if r.client == nil {
		return runtimeref.Identity{}, false, fmt.Errorf("the provider is not configured")
	}
	secretID, key, err := r.client.CommitmentKey(ctx, nonce)
	if client.IsCode(err, "forbidden") {
		return runtimeref.Identity{}, false, nil
	}
	if err != nil {
		return runtimeref.Identity{}, false, fmt.Errorf("get the commitment key for its reference: %w", err)
	}
	id := runtimeref.DeriveV2(key, secretID, nonce, target, plain)
	clear(key)
	id.Canonical = nil
	return id, true, nil
}

func (m runtimeInputModel) target() runtimeref.Target {
	return runtimeref.Target{Space: m.Space.ValueString(), WorkerName: m.WorkerName.ValueString(), BundleName: m.BundleName.ValueString(),
		EndpointName: m.EndpointName.ValueString(), OriginReservationID: m.OriginReservationID.ValueString(),
		CanonicalPublicOrigin: m.CanonicalPublicOrigin.ValueString()}
}

func (m runtimeInputModel) targetKnownExceptNonce() bool {
	for _, v := range []types.String{m.Space, m.WorkerName, m.BundleName, m.EndpointName, m.OriginReservationID, m.CanonicalPublicOrigin} {
		if v.IsUnknown() {
			return false
		}
	}
	return true
}

// maxDraws bounds the operation ids tried for one target.
const maxDraws = 64

// draw picks the operation id and nonce of a new runtime input. They must be known in the plan
// and the same when the CLI plans again at apply time, with nothing carried between the two, so
// they are derived from the target and bindings_wo_version, and the n-th candidate is the first
// operation id the Host does not know: every incarnation (after a replacement, an expiry or an
// abort) gets a new operation id and a new nonce, as a preparation never comes back.
func (r *runtimeInputResource) draw(ctx context.Context, m runtimeInputModel, configOperationID types.String) (string, string, error) {
	seed := strings.Join([]string{"takoform.runtime-input-draw.v1", m.Space.ValueString(), m.WorkerName.ValueString(), m.BundleName.ValueString(),
		m.EndpointName.ValueString(), m.OriginReservationID.ValueString(), m.CanonicalPublicOrigin.ValueString(),
		strconv.FormatInt(m.BindingsWOVersion.ValueInt64(), 10), strconv.FormatBool(m.BindingsWOVersion.IsNull())}, "\x00")
	digest := func(parts ...string) string {
		sum := sha256.Sum256([]byte(seed + "\x00" + strings.Join(parts, "\x00")))
		return hex.EncodeToString(sum[:])
	}
	if !configOperationID.IsNull() && !configOperationID.IsUnknown() {
		op := configOperationID.ValueString()
		return op, digest("nonce", op)[:32], nil
	}
	if r.client == nil {
		return "", "", fmt.Errorf("the provider is not configured")
	}
	for n := range maxDraws {
		op := "rip-" + digest("operation", strconv.Itoa(n))[:24]
		_, err := r.client.GetPreparation(ctx, op)
		if client.IsNotFound(err) {
			return op, digest("nonce", strconv.Itoa(n))[:32], nil
		}
		if err != nil {
			return "", "", err
		}
	}
	return "", "", fmt.Errorf("%d operation ids derived for this target are all taken; set operation_id", maxDraws)
}

func (m runtimeInputModel) targetKnown() bool {
	for _, v := range []types.String{m.Space, m.WorkerName, m.BundleName, m.EndpointName, m.OriginReservationID, m.CanonicalPublicOrigin, m.MaterialSetNonce} {
		if v.IsUnknown() {
			return false
		}
	}
	return true
}

// ModifyPlan computes the reference and preparation id from the configuration, bindings_wo
// included (SPEC 4), so that the worker's runtime_input_reference is known in the plan whenever
// the inputs are. Only the digest goes into the plan.
// replacement is whether an update of a runtime input replaces it, sealing the configuration's
// values again under a new nonce, and whether that is for its stranding alone (said in a warning):
//   - a bump of bindings_wo_version, from one set value to another, re-seals the same values under
//     a new reference; setting it on an imported object (from null) is no bump;
//   - an input delivered to a worker that is gone (stranded names it) can serve no other: it is
//     replaced like a bump (SPEC 4).
func replacement(creating bool, prior, planned types.Int64, stranded string) (replace, strandedAlone bool) {
	if creating {
		return false, false
	}
	bumped := !prior.IsNull() && !planned.Equal(prior)
	return bumped || stranded != "", stranded != "" && !bumped
}

func (r *runtimeInputResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() {
		return
	}
	var plan runtimeInputModel
	var configOperationID, configNonce types.String
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, path.Root("operation_id"), &configOperationID)...)
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, path.Root("material_set_nonce"), &configNonce)...)
	if resp.Diagnostics.HasError() {
		return
	}
	proposed := plan
	creating := req.State.Raw.IsNull()
	var state runtimeInputModel
	if !creating {
		resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	}
	values, unset, known, diags := configBindings(ctx, req.Config)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}

	stranded := ""
	if !creating {
		stranded = getStranded(ctx, req.Private)
	}
	bumped, strandedAlone := replacement(creating, state.BindingsWOVersion, plan.BindingsWOVersion, stranded)
	if strandedAlone {
		resp.Diagnostics.AddAttributeWarning(path.Root("reference"), "Runtime input replaced: its worker is gone",
			fmt.Sprintf("This runtime input was delivered to worker UID %s, which is no longer on the Host (destroyed with -target, or deleted outside this configuration). "+
				"A runtime input is delivered once, to one worker UID, so this plan replaces it: the values in bindings_wo are sealed again for the worker that will use them.", stranded))
	}
	switch {
	case creating && plan.targetKnownExceptNonce() && !plan.BindingsWOVersion.IsUnknown() && !configOperationID.IsUnknown():
		op, nonce, err := r.draw(ctx, plan, configOperationID)
		if err != nil {
			addError(&resp.Diagnostics, "Unable to plan runtime input", err)
			return
		}
		plan.OperationID = types.StringValue(op)
		if configNonce.IsNull() {
			plan.MaterialSetNonce = types.StringValue(nonce)
		}
	case creating:
		if configNonce.IsNull() {
			plan.MaterialSetNonce = types.StringUnknown()
		}
	case configNonce.IsNull() && !bumped:
		plan.MaterialSetNonce = state.MaterialSetNonce
	case configNonce.IsNull():
		plan.MaterialSetNonce = types.StringUnknown() // replaced: the create's plan draws it
	}
	if bumped {
		resp.RequiresReplace.Append(path.Root("bindings_wo_version"))
	}

	switch {
	case unset && creating:
		resp.Diagnostics.AddAttributeError(path.Root("bindings_wo"), "Missing bindings",
			"bindings_wo must be set to create a runtime input: it holds the values the Host seals.")
		return
	case unset && !bumped && plan.targetKnown() && plan.MaterialSetNonce.Equal(state.MaterialSetNonce):
		// An imported or generated configuration has no values: keep what is sealed.
		plan.Reference, plan.PreparationID, plan.BindingNames = state.Reference, state.PreparationID, state.BindingNames
	case unset:
		plan.Reference, plan.PreparationID = types.StringUnknown(), types.StringUnknown()
		plan.BindingNames = state.BindingNames
	case !known || !plan.targetKnown():
		plan.Reference, plan.PreparationID = types.StringUnknown(), types.StringUnknown()
		plan.BindingNames = types.SetUnknown(types.StringType)
		if values != nil {
			plan.BindingNames = namesOf(values)
		}
	default:
		// An input made with a rip1 reference keeps it while its values, nonce and target stand
		// (SPEC 3.5): it is not replaced only to change format.
		var standing string
		if !creating && !bumped {
			standing = state.Reference.ValueString()
		}
		id, ok, err := r.reference(ctx, plan, values, standing)
		switch {
		case err != nil:
			addError(&resp.Diagnostics, "Unable to plan runtime input", err)
			return
		case !ok && standing != "" && plan.MaterialSetNonce.Equal(state.MaterialSetNonce) && plan.target() == state.target():
			// A read-only plan cannot tell whether the values changed: it does not plan a
			// replacement of every runtime input for that, and says so.
			resp.Diagnostics.AddAttributeWarning(path.Root("bindings_wo"), "Runtime input values not compared",
				"The provider's API key cannot write (it lacks resources:write), so the Host does not give it the commitment key that a reference is computed with (SPEC 3.5: a reference only a writer can test guesses against). "+
					"This plan keeps the runtime input as it is; a change to bindings_wo shows only in a plan made with a key that can write.")
			plan.Reference, plan.PreparationID, plan.BindingNames = state.Reference, state.PreparationID, state.BindingNames
		case !ok:
			resp.Diagnostics.AddAttributeWarning(path.Root("reference"), "Runtime input reference unknown until apply",
				"The provider's API key cannot write (it lacks resources:write), so the Host does not give it the commitment key that a reference is computed with (SPEC 3.5: a reference only a writer can test guesses against). "+
					"The reference, and the runtime_input_reference of the worker that uses it, are planned as unknown; an apply with a key that can write computes them.")
			plan.Reference, plan.PreparationID, plan.BindingNames = types.StringUnknown(), types.StringUnknown(), namesOf(values)
		default:
			plan.Reference, plan.PreparationID, plan.BindingNames = types.StringValue(id.Reference), types.StringValue(id.PreparationID), namesOf(values)
		}
	}
	if !plan.Reference.IsUnknown() && !plan.BindingNames.IsUnknown() && !plan.BindingNames.IsNull() {
		var names []string
		if !plan.BindingNames.ElementsAs(ctx, &names, false).HasError() {
			r.bindings.record(plan.Reference.ValueString(), names) // for the worker that consumes it
		}
	}
	if !creating && !plan.Reference.Equal(state.Reference) {
		// New values (or a new nonce or target): a runtime input never changes in place.
		resp.RequiresReplace.Append(path.Root("reference"))
	}
	if !creating && (plan.Reference.IsUnknown() || !plan.Reference.Equal(state.Reference)) {
		plan.Status, plan.ExpiresAt = types.StringUnknown(), types.StringUnknown()
	} else if !creating {
		plan.Status, plan.ExpiresAt = state.Status, state.ExpiresAt
	}
	plan.ID = plan.OperationID // unknown only while the operation id is
	resp.Diagnostics.Append(writePlan(ctx, resp, &proposed, &plan)...)
}

func namesOf(values map[string]types.String) types.Set {
	names := make([]string, 0, len(values))
	for k := range values {
		names = append(names, k)
	}
	slices.Sort(names)
	set, _ := types.SetValueFrom(context.Background(), types.StringType, names)
	return set
}

func (r *runtimeInputResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan runtimeInputModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	values, unset, known, diags := configBindings(ctx, req.Config)
	resp.Diagnostics.Append(diags...)
	if resp.Diagnostics.HasError() {
		return
	}
	if unset || !known {
		resp.Diagnostics.AddAttributeError(path.Root("bindings_wo"), "Unable to create runtime input", "bindings_wo has no known values at apply time.")
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, 5*time.Minute)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	id, ok, err := r.reference(ctx, plan, values, plan.Reference.ValueString())
	if err == nil && !ok {
		err = fmt.Errorf("the provider's API key cannot write (it lacks resources:write): it can neither get the commitment key nor create a runtime input")
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to create runtime input", err)
		return
	}
	if !plan.Reference.IsUnknown() && plan.Reference.ValueString() != id.Reference {
		// The values are not named: only that they differ from the ones the plan was made with.
		resp.Diagnostics.AddAttributeError(path.Root("bindings_wo"), "Unable to create runtime input: the bindings changed between plan and apply",
			fmt.Sprintf("The plan computed reference %s from bindings_wo, but the values given at apply time give %s. "+
				"This happens when a value comes from a source that yields a new value each time it is read (an ephemeral resource or function that mints a fresh secret, a timestamp): "+
				"the plan would promise the worker one reference and the Host would seal another. "+
				"Give bindings_wo values that are the same at plan and apply (read a stored secret, or keep a generated one in a managed resource), "+
				"or run plan and apply together (`terraform apply` or `tofu apply` without a saved plan).", plan.Reference.ValueString(), id.Reference))
		return
	}
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to create runtime input", err)
		return
	}
	// The Host takes the origin from the reservation; say so before any value leaves.
	res, err := r.client.GetReservation(ctx, plan.OriginReservationID.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to create runtime input", fmt.Errorf("read its reservation %q: %w", plan.OriginReservationID.ValueString(), err))
		return
	}
	if res.CanonicalOrigin != plan.CanonicalPublicOrigin.ValueString() {
		resp.Diagnostics.AddAttributeError(path.Root("canonical_public_origin"), "Unable to create runtime input",
			fmt.Sprintf("canonical_public_origin is %s, but reservation %q holds %s; set it from the reservation's canonical_origin.",
				plan.CanonicalPublicOrigin.ValueString(), res.ID, res.CanonicalOrigin))
		return
	}
	token := newToken()
	prep, _, err := r.client.PutPreparation(ctx, plan.OperationID.ValueString(), token, client.PreparationRequest{
		Format: client.PreparationFormat, MaterialSetNonce: plan.MaterialSetNonce.ValueString(), RuntimeInputReference: id.Reference,
		Target: client.PreparationTarget{Space: plan.Space.ValueString(), WorkerName: plan.WorkerName.ValueString(), BundleName: plan.BundleName.ValueString(),
			EndpointName: plan.EndpointName.ValueString(), OriginReservationID: plan.OriginReservationID.ValueString()},
		Bindings: plainBindings(values),
	})
	if err != nil {
		if isUnknownOutcome(err) {
			plan.ID = plan.OperationID
			plan.Reference, plan.PreparationID = types.StringValue(id.Reference), types.StringValue(id.PreparationID)
			plan.BindingNames, plan.Status, plan.ExpiresAt = namesOf(values), types.StringNull(), types.StringNull()
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to create runtime input", err)
		return
	}
	r.fill(ctx, &plan, prep)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, runtimeInputIdentityModel{OperationID: plan.OperationID})...)
}

func (r *runtimeInputResource) fill(ctx context.Context, m *runtimeInputModel, p client.Preparation) {
	m.ID = types.StringValue(p.OperationID)
	m.OperationID, m.Space, m.WorkerName = types.StringValue(p.OperationID), types.StringValue(p.Target.Space), types.StringValue(p.Target.WorkerName)
	m.BundleName, m.EndpointName = types.StringValue(p.Target.BundleName), types.StringValue(p.Target.EndpointName)
	m.OriginReservationID, m.CanonicalPublicOrigin = types.StringValue(p.Target.OriginReservationID), types.StringValue(p.Target.CanonicalPublicOrigin)
	m.MaterialSetNonce, m.Reference, m.PreparationID = types.StringValue(p.MaterialSetNonce), types.StringValue(p.RuntimeInputReference), types.StringValue(p.PreparationID)
	names := slices.Clone(p.BindingNames)
	slices.Sort(names)
	m.BindingNames, _ = types.SetValueFrom(ctx, types.StringType, names)
	m.Status, m.ExpiresAt = types.StringValue(p.Status), types.StringValue(p.ExpiresAt)
	m.BindingsWO = types.MapNull(types.StringType)
}

func (r *runtimeInputResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state runtimeInputModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The identity is set first: terraform before 1.12 keeps none, and the framework wants one even
	// from a Read that removes the resource.
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, runtimeInputIdentityModel{OperationID: state.OperationID})...)
	p, err := r.client.GetPreparation(ctx, state.OperationID.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read runtime input", err)
		return
	}
	if p.Status == "expired" || p.Status == "aborted" {
		resp.State.RemoveResource(ctx) // SPEC 4: the next plan prepares a new one
		return
	}
	if p.Status == "failed" {
		resp.Diagnostics.AddWarning("Runtime input failed", fmt.Sprintf("Runtime input %s failed: %s", p.OperationID, derefOr(p.Failure, "no detail")))
	}
	r.fill(ctx, &state, p)
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *runtimeInputModel) any { return runtimeInputIdentityModel{OperationID: m.OperationID} })...)
	resp.Diagnostics.Append(adoptToken(ctx, req.Private, resp.Private, p.OwnershipToken)...)
	gone, err := r.boundWorkerGone(ctx, p)
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read runtime input", err)
		return
	}
	resp.Diagnostics.Append(setStranded(ctx, resp.Private, gone)...)
}

// boundWorkerGone answers, for an input delivered to a worker, that worker's UID when it is gone
// from the Host: deleted (destroy -target, a deletion outside the configuration, or a replacement
// under its name). Such an input can serve no worker again (SPEC 3.5: a delivered input belongs to
// one worker UID), so it plans its own replacement (SPEC 4). A deleted worker is known by its
// deletion attestation, which the Host keeps for good: a read of the ledger alone, where a read of
// the worker would also ask its backend how it runs.
func (r *runtimeInputResource) boundWorkerGone(ctx context.Context, p client.Preparation) (string, error) {
	if p.BoundWorker == nil || p.Status != "settled" {
		return "", nil
	}
	_, err := r.client.GetAttestation(ctx, p.BoundWorker.UID)
	switch {
	case client.IsNotFound(err):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("read the deletion attestation of the worker it was delivered to: %w", err)
	}
	return p.BoundWorker.UID, nil
}

// The UID of a gone worker an input was delivered to lives in private state under this key,
// from the Read that found it gone to the plan that replaces the input.
const strandedKey = "stranded"

func setStranded(ctx context.Context, p privateWriter, workerUID string) diag.Diagnostics {
	if workerUID == "" {
		return p.SetKey(ctx, strandedKey, nil)
	}
	raw, _ := json.Marshal(map[string]string{"workerUid": workerUID})
	return p.SetKey(ctx, strandedKey, raw)
}

func getStranded(ctx context.Context, p privateReader) string {
	if p == nil {
		return ""
	}
	raw, _ := p.GetKey(ctx, strandedKey)
	var v map[string]string
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return ""
	}
	return v["workerUid"]
}

// Update changes nothing on the Host (a runtime input never changes in place): it records a
// bindings_wo_version set on an imported object, or new timeouts.
func (r *runtimeInputResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan runtimeInputModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	p, err := r.client.GetPreparation(ctx, plan.OperationID.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read runtime input", err)
		return
	}
	version := plan.BindingsWOVersion
	r.fill(ctx, &plan, p)
	plan.BindingsWOVersion = version
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, runtimeInputIdentityModel{OperationID: plan.OperationID})...)
}

func (r *runtimeInputResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state runtimeInputModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to delete runtime input", err)
		return
	}
	token, gone, diags := deleteToken(ctx, req.Private, "Unable to delete runtime input", fmt.Sprintf("runtime input %q", state.OperationID.ValueString()),
		func(ctx context.Context) (client.Preparation, error) {
			return r.client.GetPreparation(ctx, state.OperationID.ValueString())
		},
		func(x client.Preparation) *string { return x.OwnershipToken })
	resp.Diagnostics.Append(diags...)
	if gone || resp.Diagnostics.HasError() {
		return
	}
	if _, err := r.client.DeletePreparation(ctx, state.OperationID.ValueString(), token); err != nil && !client.IsNotFound(err) {
		addError(&resp.Diagnostics, "Unable to delete runtime input", err)
	}
}

func (r *runtimeInputResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughWithIdentity(ctx, path.Root("operation_id"), path.Root("operation_id"), req, resp)
}
