package provider

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/boolplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

var (
	_ resource.ResourceWithConfigure   = (*endpointResource)(nil)
	_ resource.ResourceWithImportState = (*endpointResource)(nil)
	_ resource.ResourceWithIdentity    = (*endpointResource)(nil)
	_ resource.ResourceWithModifyPlan  = (*endpointResource)(nil)
)

func newEndpointResource() resource.Resource { return &endpointResource{} }

// endpointResource is takoform_worker_endpoint: the public route of one worker at a canonical
// origin. An endpoint never changes in place.
type endpointResource struct {
	client  *client.Client
	origins *planned[string]
}

// hostnameOf is the host name of a canonical origin, as the Host projects an endpoint's hostname.
func hostnameOf(origin string) string {
	u, err := url.Parse(origin)
	if err != nil {
		return origin
	}
	return u.Hostname()
}

type endpointModel struct {
	ID                  types.String   `tfsdk:"id"`
	Space               types.String   `tfsdk:"space"`
	Name                types.String   `tfsdk:"name"`
	Worker              types.String   `tfsdk:"worker"`
	WorkerID            types.String   `tfsdk:"worker_id"`
	OriginReservationID types.String   `tfsdk:"origin_reservation_id"`
	OfferingID          types.String   `tfsdk:"offering_id"`
	Hostname            types.String   `tfsdk:"hostname"`
	URL                 types.String   `tfsdk:"url"`
	HostMinted          types.Bool     `tfsdk:"host_minted"`
	Timeouts            timeouts.Value `tfsdk:"timeouts"`
}

const hostMintedPrefix = "hostmint-"

// reservationChoice plans origin_reservation_id: omitted, a Host-minted id in state stays; a
// supplied one in state means the endpoint moves to a minted reservation, which replaces it.
type reservationChoice struct{}

func (reservationChoice) Description(context.Context) string {
	return "Keeps a Host-minted reservation id while the argument is omitted; replaces the endpoint when the reservation changes."
}

func (m reservationChoice) MarkdownDescription(ctx context.Context) string { return m.Description(ctx) }

func (reservationChoice) PlanModifyString(_ context.Context, req planmodifier.StringRequest, resp *planmodifier.StringResponse) {
	if req.State.Raw.IsNull() || req.Plan.Raw.IsNull() {
		return
	}
	switch {
	case req.ConfigValue.IsNull() && strings.HasPrefix(req.StateValue.ValueString(), hostMintedPrefix):
		resp.PlanValue = req.StateValue
	case req.ConfigValue.IsNull():
		resp.PlanValue = types.StringUnknown()
		resp.RequiresReplace = true
	case !req.PlanValue.Equal(req.StateValue):
		resp.RequiresReplace = true
	}
}

func (r *endpointResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker_endpoint"
}

func (r *endpointResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	known := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "The public route of one worker at a canonical origin. It is recorded on its reservation when it is created " +
			"(the reservation's deletion witness), so the origin stays held until the endpoint is provably gone. Create returns once the route is Ready. " +
			"An endpoint never changes in place: every argument replaces it.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The endpoint's UID; `takoform_worker_endpoint_activation.endpoint_id` follows it.", Computed: true, PlanModifiers: known,
			},
			"space": schema.StringAttribute{
				MarkdownDescription: "Space of the endpoint and its worker.", Required: true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"name": schema.StringAttribute{
				MarkdownDescription: "Name of the endpoint, unique in its space.", Required: true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"worker": schema.StringAttribute{
				MarkdownDescription: "Name of the worker (in the same space) the endpoint routes to.", Required: true, Validators: nameValidators(), PlanModifiers: replace,
			},
			"worker_id": schema.StringAttribute{
				MarkdownDescription: "The worker's `id`. Set it so that replacing the worker replaces its endpoint; the provider refuses to create the endpoint when the named worker's UID differs. Omitted, it shows the UID of the worker the endpoint was created on.",
				Optional:            true,
				Computed:            true,
				Validators:          []validator.String{stringvalidator.RegexMatches(vocab.UUID, "must be a worker's id (a UUID)")},
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), stringplanmodifier.RequiresReplace()},
			},
			"origin_reservation_id": schema.StringAttribute{
				MarkdownDescription: "The reservation to publish through. Omitted, the Host mints one (`hostmint-…`) for the worker's derived address, and this shows its id.",
				Optional:            true,
				Computed:            true,
				Validators:          reservationIDValidators(),
				PlanModifiers:       []planmodifier.String{reservationChoice{}},
			},
			"offering_id": schema.StringAttribute{
				MarkdownDescription: "The `worker-endpoint` offering. May be omitted when exactly one is sold to the organization, or exactly one on the installation the worker runs on (and then shows the one chosen). Changing it replaces the endpoint.",
				Optional:            true,
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), stringplanmodifier.RequiresReplace()},
			},
			"hostname": schema.StringAttribute{
				MarkdownDescription: "Host name the endpoint answers on: the host of its canonical origin. Known in the plan when `origin_reservation_id` names a reservation (one this plan creates, or one that stands); a Host-minted endpoint's is known after apply.", Computed: true, PlanModifiers: known,
			},
			"url": schema.StringAttribute{
				MarkdownDescription: "The endpoint's public URL: its reservation's canonical origin and `/`. Known in the plan when `origin_reservation_id` names a reservation (one this plan creates, or one that stands); a Host-minted endpoint's is known after apply.", Computed: true, PlanModifiers: known,
			},
			"host_minted": schema.BoolAttribute{
				MarkdownDescription: "Whether the endpoint publishes through a reservation the Host minted.",
				Computed:            true,
				PlanModifiers:       []planmodifier.Bool{boolplanmodifier.UseStateForUnknown()},
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: true, Delete: true}),
		},
	}
}

func (r *endpointResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = spaceNameIdentitySchema("endpoint")
}

func (r *endpointResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
	r.origins = memoOf(req.ProviderData).origins
}

// ModifyPlan plans url and hostname of an endpoint to be created on a supplied reservation: the
// Host projects the reservation's canonical origin and "/" as the url, and its host name as the
// hostname. The origin is the one this plan derived for a reservation it creates, else the one an
// existing reservation holds. A Host-minted endpoint's origin is known only once it is minted.
func (r *endpointResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() || !req.State.Raw.IsNull() {
		return // a destroy, or an update (every argument but timeouts replaces)
	}
	var plan endpointModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() || plan.OriginReservationID.IsNull() || plan.OriginReservationID.IsUnknown() {
		return
	}
	id := plan.OriginReservationID.ValueString()
	origin, ok := r.origins.lookup(id)
	if !ok && r.client != nil {
		// A failed read leaves url unknown: the plan does not fail on what only decorates it.
		if res, err := r.client.GetReservation(ctx, id); err == nil {
			origin, ok = plannedOrigin(res)
		}
	}
	if !ok {
		return
	}
	plan.URL, plan.Hostname = types.StringValue(origin+"/"), types.StringValue(hostnameOf(origin))
	resp.Diagnostics.Append(setPlan(ctx, &resp.Plan, &plan)...)
}

// plannedOrigin is the origin a new endpoint on reservation res is planned to serve, when the
// reservation still holds one it can publish: not one that expired or was released.
func plannedOrigin(res client.Reservation) (string, bool) {
	if res.Status == "expired" || res.Status == "released" || res.CanonicalOrigin == "" {
		return "", false
	}
	return res.CanonicalOrigin, true
}

func (r *endpointResource) fill(m *endpointModel, e client.Endpoint) {
	m.ID, m.Space, m.Name, m.Worker = types.StringValue(e.UID), types.StringValue(e.Space), types.StringValue(e.Name), types.StringValue(e.Worker.Name)
	m.WorkerID, m.OfferingID = types.StringValue(e.Worker.UID), types.StringValue(e.OfferingID)
	m.OriginReservationID, m.Hostname, m.URL = types.StringValue(e.OriginReservationID), types.StringValue(e.Hostname), types.StringValue(e.URL)
	m.HostMinted = types.BoolValue(e.HostMinted)
}

func (r *endpointResource) waitReady(ctx context.Context, space, name string, e client.Endpoint) (client.Endpoint, error) {
	if e.Ready {
		return e, nil
	}
	err := waitFor(ctx, func() (bool, string, error) {
		got, err := r.client.GetEndpoint(ctx, space, name)
		if err != nil {
			return false, "", err
		}
		e = got
		return got.Ready, "endpoint " + space + "/" + name + " is not Ready: " + conditionsText(got.Conditions), nil
	})
	return e, err
}

func (r *endpointResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan endpointModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to create endpoint", err)
		return
	}
	space, name, worker := plan.Space.ValueString(), plan.Name.ValueString(), plan.Worker.ValueString()
	if !plan.WorkerID.IsNull() && !plan.WorkerID.IsUnknown() {
		w, err := r.client.GetWorkerDigests(ctx, space, worker)
		if err != nil {
			addError(&resp.Diagnostics, "Unable to create endpoint", fmt.Errorf("read its worker %s/%s: %w", space, worker, err))
			return
		}
		if w.UID != plan.WorkerID.ValueString() {
			resp.Diagnostics.AddError("Unable to create endpoint",
				fmt.Sprintf("worker_id is %s, but worker %s/%s is now UID %s: the endpoint would route to another incarnation than the one configured. Plan again.",
					plan.WorkerID.ValueString(), space, worker, w.UID))
			return
		}
	}
	var reservationID *string
	if !plan.OriginReservationID.IsUnknown() {
		reservationID = strPtr(plan.OriginReservationID)
	}
	token := newToken()
	e, _, err := r.client.PutEndpoint(ctx, space, name, token, 0, client.EndpointSpec{Worker: worker, OriginReservationID: reservationID, OfferingID: strPtr(plan.OfferingID)})
	if err == nil {
		e, err = r.waitReady(ctx, space, name, e)
	}
	if err != nil {
		if isUnknownOutcome(err) || e.UID != "" {
			plan.ID, plan.Hostname, plan.URL = stringOrNull(nonEmpty(e.UID)), stringOrNull(nonEmpty(e.Hostname)), stringOrNull(nonEmpty(e.URL))
			plan.OriginReservationID = nullIfUnknown(plan.OriginReservationID)
			if e.OriginReservationID != "" {
				plan.OriginReservationID = types.StringValue(e.OriginReservationID)
			}
			plan.HostMinted = types.BoolValue(e.HostMinted)
			plan.WorkerID, plan.OfferingID = nullIfUnknown(plan.WorkerID), nullIfUnknown(plan.OfferingID)
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to create endpoint", err)
		return
	}
	if !plan.WorkerID.IsUnknown() && e.Worker.UID != plan.WorkerID.ValueString() {
		resp.Diagnostics.AddWarning("Endpoint routes to another worker incarnation",
			fmt.Sprintf("The endpoint was created on worker UID %s, not %s.", e.Worker.UID, plan.WorkerID.ValueString()))
	}
	r.fill(&plan, e)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, spaceNameIdentityModel{Space: plan.Space, Name: plan.Name})...)
}

func (r *endpointResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state endpointModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The identity is set first: terraform before 1.12 keeps none, and the framework wants one even
	// from a Read that removes the resource.
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, spaceNameIdentityModel{Space: state.Space, Name: state.Name})...)
	e, err := r.client.GetEndpoint(ctx, state.Space.ValueString(), state.Name.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read endpoint", err)
		return
	}
	r.fill(&state, e)
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *endpointModel) any { return spaceNameIdentityModel{Space: m.Space, Name: m.Name} })...)
	resp.Diagnostics.Append(adoptToken(ctx, req.Private, resp.Private, e.OwnershipToken)...)
}

// Update runs only when timeouts change (every other argument replaces the endpoint). It reads the
// endpoint again and, when its route is not active, re-sends it unchanged so that the Host resumes
// it.
func (r *endpointResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan endpointModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Update(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	space, name := plan.Space.ValueString(), plan.Name.ValueString()
	e, err := r.client.GetEndpoint(ctx, space, name)
	if err == nil && !plan.WorkerID.IsUnknown() && e.Worker.UID != plan.WorkerID.ValueString() {
		err = fmt.Errorf("endpoint %s/%s routes to worker UID %s, not worker_id %s", space, name, e.Worker.UID, plan.WorkerID.ValueString())
	}
	if err == nil && !e.Ready {
		token, d := getToken(ctx, req.Private)
		resp.Diagnostics.Append(d...)
		if err = r.client.RequireOwnership(ctx); err == nil {
			e, _, err = r.client.PutEndpoint(ctx, space, name, token, e.Revision,
				client.EndpointSpec{Worker: e.Worker.Name, OriginReservationID: reservationOf(e), OfferingID: strPtr(plan.OfferingID)})
		}
		if err == nil {
			e, err = r.waitReady(ctx, space, name, e)
		}
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to update endpoint", err)
		return
	}
	r.fill(&plan, e)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, spaceNameIdentityModel{Space: plan.Space, Name: plan.Name})...)
}

func reservationOf(e client.Endpoint) *string {
	if e.HostMinted {
		return nil
	}
	return &e.OriginReservationID
}

func (r *endpointResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state endpointModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to delete endpoint", err)
		return
	}
	space, name := state.Space.ValueString(), state.Name.ValueString()
	token, gone, diags := deleteToken(ctx, req.Private, "Unable to delete endpoint", fmt.Sprintf("endpoint %s/%s", space, name),
		func(ctx context.Context) (client.Endpoint, error) { return r.client.GetEndpoint(ctx, space, name) },
		func(x client.Endpoint) *string { return x.OwnershipToken })
	resp.Diagnostics.Append(diags...)
	if gone || resp.Diagnostics.HasError() {
		return
	}
	_, err := r.client.DeleteEndpoint(ctx, space, name, token)
	if err != nil && !client.IsNotFound(err) {
		if client.IsCode(err, "endpoint_activated") {
			err = fmt.Errorf("%s\n\nDestroy the takoform_worker_endpoint_activation of reservation %s first "+
				"(a configuration that passes the endpoint's id as the activation's endpoint_id orders this by itself)", describe(err), state.OriginReservationID.ValueString())
		}
		addError(&resp.Diagnostics, "Unable to delete endpoint", err)
	}
}

// ImportState takes `space/name` or an identity.
func (r *endpointResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	importSpaceName(ctx, req, resp, "endpoint")
}
