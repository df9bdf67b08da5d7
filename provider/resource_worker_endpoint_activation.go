package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
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
)

var (
	_ resource.ResourceWithConfigure   = (*activationResource)(nil)
	_ resource.ResourceWithImportState = (*activationResource)(nil)
	_ resource.ResourceWithIdentity    = (*activationResource)(nil)
)

func newActivationResource() resource.Resource { return &activationResource{} }

// activationResource is takoform_worker_endpoint_activation: a supplied reservation's proof that
// this exact endpoint publishes its origin. It is what the destroy order undoes first.
type activationResource struct {
	client *client.Client
}

type activationModel struct {
	ID            types.String   `tfsdk:"id"`
	ReservationID types.String   `tfsdk:"reservation_id"`
	EndpointID    types.String   `tfsdk:"endpoint_id"`
	Status        types.String   `tfsdk:"status"`
	Revision      types.Int64    `tfsdk:"revision"`
	Timeouts      timeouts.Value `tfsdk:"timeouts"`
}

type activationIdentityModel struct {
	ReservationID types.String `tfsdk:"reservation_id"`
}

// maxActivationTokens bounds the derived tokens tried for one (reservation, endpoint) pair.
const maxActivationTokens = 8

// activationToken derives the ownership token of an activation from its reservation's token and
// endpoint. The Host answers no GET with an activation's token (a needed Host change), so import
// finds it again by derivation; n moves past tokens a deleted activation left tombstoned.
func activationToken(reservationToken, endpointUID string, n int) string {
	sum := sha256.Sum256([]byte("takoform.activation-token.v1\x00" + reservationToken + "\x00" + endpointUID + "\x00" + strconv.Itoa(n)))
	return "act-" + hex.EncodeToString(sum[:])[:40]
}

func (r *activationResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker_endpoint_activation"
}

func (r *activationResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "Activates a supplied reservation with the endpoint created on it: the reservation's proof that this exact endpoint publishes its origin. " +
			"An activated reservation does not age and cannot be released; destroy the activation first (the dependency on `endpoint_id` orders it).",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The activation's id: its `reservation_id`, known in the plan whenever that is (so the CLI prints `[id=…]`).",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), mirrorString{from: path.Root("reservation_id")}},
			},
			"reservation_id": schema.StringAttribute{
				MarkdownDescription: "The reservation to activate.", Required: true, Validators: reservationIDValidators(), PlanModifiers: replace,
			},
			"endpoint_id": schema.StringAttribute{
				MarkdownDescription: "The `id` of the endpoint created on the reservation. Replacing the endpoint replaces the activation.",
				Required:            true,
				Validators:          []validator.String{stringvalidator.RegexMatches(vocab.UUID, "must be an endpoint's id (a UUID)")},
				PlanModifiers:       replace,
			},
			"status": schema.StringAttribute{
				MarkdownDescription: "The reservation's status: `activated` while this activation stands.", Computed: true,
			},
			"revision": schema.Int64Attribute{
				MarkdownDescription: "The reservation's revision.", Computed: true,
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Delete: true}),
		},
	}
}

func (r *activationResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = identityschema.Schema{
		Attributes: map[string]identityschema.Attribute{
			"reservation_id": identityschema.StringAttribute{RequiredForImport: true, Description: "The activated reservation's id."},
		},
	}
}

func (r *activationResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
}

func (r *activationResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan activationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to activate reservation", err)
		return
	}
	plan.ID = plan.ReservationID
	id, endpointUID := plan.ReservationID.ValueString(), plan.EndpointID.ValueString()
	current, err := r.client.GetReservation(ctx, id)
	if err != nil {
		addError(&resp.Diagnostics, "Unable to activate reservation", err)
		return
	}
	var res client.Reservation
	var token string
	for n := 0; ; n++ {
		token = newToken()
		if current.OwnershipToken != nil {
			token = activationToken(*current.OwnershipToken, endpointUID, n)
		}
		res, _, err = r.client.PutActivation(ctx, id, token, endpointUID)
		if !client.IsCode(err, "tombstoned") || n+1 >= maxActivationTokens {
			break
		}
	}
	if err != nil {
		if isUnknownOutcome(err) {
			plan.Status, plan.Revision = types.StringNull(), types.Int64Null()
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to activate reservation", err)
		return
	}
	plan.Status, plan.Revision = types.StringValue(res.Status), types.Int64Value(res.Revision)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, activationIdentityModel{ReservationID: plan.ReservationID})...)
}

func (r *activationResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state activationModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The identity is set first: terraform before 1.12 keeps none, and the framework wants one even
	// from a Read that removes the resource.
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, activationIdentityModel{ReservationID: state.ReservationID})...)
	res, err := r.client.GetReservation(ctx, state.ReservationID.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read activation", err)
		return
	}
	importing := state.EndpointID.IsNull()
	if res.Status != "activated" || res.Endpoint == nil || (!importing && res.Endpoint.UID != state.EndpointID.ValueString()) {
		if importing {
			resp.Diagnostics.AddError("Unable to import activation", fmt.Sprintf("Reservation %q is %s, not activated.", res.ID, res.Status))
			return
		}
		resp.State.RemoveResource(ctx) // deactivated behind the provider's back
		return
	}
	state.ID = types.StringValue(res.ID)
	state.EndpointID, state.Status, state.Revision = types.StringValue(res.Endpoint.UID), types.StringValue(res.Status), types.Int64Value(res.Revision)
	token, diags := getToken(ctx, req.Private)
	resp.Diagnostics.Append(diags...)
	if token == "" {
		if token, err = r.adopt(ctx, res); err != nil {
			addError(&resp.Diagnostics, "Unable to import activation", err)
			return
		}
		resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	}
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *activationModel) any { return activationIdentityModel{ReservationID: m.ReservationID} })...)
}

// adopt finds the ownership token of an activation this provider created, by replaying its PUT
// with each derived token: a replay answers from storage and changes nothing, a tombstoned token
// answers 410, another owner's 409.
func (r *activationResource) adopt(ctx context.Context, res client.Reservation) (string, error) {
	// The Host tells an activation's token (GET .../activation); a Host from before that route
	// answers 404 for it, and the tokens this provider derives are tried instead.
	if got, err := r.client.GetActivation(ctx, res.ID); err == nil && got.OwnershipToken != nil && *got.OwnershipToken != "" {
		return *got.OwnershipToken, nil
	} else if err != nil && !client.IsNotFound(err) {
		return "", err
	}
	if res.OwnershipToken == nil {
		return "", fmt.Errorf("reservation %q has no owner to derive its activation's token from", res.ID)
	}
	for n := range maxActivationTokens {
		token := activationToken(*res.OwnershipToken, res.Endpoint.UID, n)
		got, resp, err := r.client.PutActivation(ctx, res.ID, token, res.Endpoint.UID)
		switch {
		case err == nil && resp.Replayed && got.Status == "activated":
			return token, nil
		case client.IsCode(err, "tombstoned"):
			continue
		case err != nil:
			return "", fmt.Errorf("%w\n\nThis Host does not tell an activation's ownership token, and this one was not created by this provider, so it cannot be adopted", err)
		default:
			return token, nil
		}
	}
	return "", fmt.Errorf("no activation token derived for reservation %q is live", res.ID)
}

// Update changes nothing on the Host: both arguments replace the activation.
func (r *activationResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan activationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	res, err := r.client.GetReservation(ctx, plan.ReservationID.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read activation", err)
		return
	}
	plan.ID, plan.Status, plan.Revision = plan.ReservationID, types.StringValue(res.Status), types.Int64Value(res.Revision)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, activationIdentityModel{ReservationID: plan.ReservationID})...)
}

func (r *activationResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state activationModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to deactivate reservation", err)
		return
	}
	token, diags := getToken(ctx, req.Private)
	resp.Diagnostics.Append(diags...)
	if token == "" {
		resp.Diagnostics.AddError("Unable to deactivate reservation", "No ownership token is known for this activation; refresh (or import) it first.")
		return
	}
	if _, err := r.client.DeleteActivation(ctx, state.ReservationID.ValueString(), token); err != nil && !client.IsNotFound(err) {
		addError(&resp.Diagnostics, "Unable to deactivate reservation", err)
	}
}

func (r *activationResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughWithIdentity(ctx, path.Root("reservation_id"), path.Root("reservation_id"), req, resp)
}

// mirrorString plans an attribute as a copy of another one of the configuration while that one is
// known, so that an `id` mirroring an argument is known in the plan wherever the argument is.
type mirrorString struct{ from path.Path }

func (m mirrorString) Description(context.Context) string {
	return "Equals " + m.from.String() + " whenever that is known."
}

func (m mirrorString) MarkdownDescription(ctx context.Context) string { return m.Description(ctx) }

func (m mirrorString) PlanModifyString(ctx context.Context, req planmodifier.StringRequest, resp *planmodifier.StringResponse) {
	if req.Plan.Raw.IsNull() {
		return
	}
	var v types.String
	resp.Diagnostics.Append(req.Config.GetAttribute(ctx, m.from, &v)...)
	if !v.IsUnknown() && !v.IsNull() {
		resp.PlanValue = v
	}
}
