package provider

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
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
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

var (
	_ resource.ResourceWithConfigure   = (*reservationResource)(nil)
	_ resource.ResourceWithModifyPlan  = (*reservationResource)(nil)
	_ resource.ResourceWithImportState = (*reservationResource)(nil)
	_ resource.ResourceWithIdentity    = (*reservationResource)(nil)
)

func newReservationResource() resource.Resource { return &reservationResource{} }

// reservationResource is takoform_worker_endpoint_origin_reservation: a value-free hold on one
// canonical origin (SPEC 3.3). It never changes in place.
type reservationResource struct {
	client  *client.Client
	origins *planned[string]
}

type reservationModel struct {
	ID              types.String   `tfsdk:"id"`
	Space           types.String   `tfsdk:"space"`
	WorkerName      types.String   `tfsdk:"worker_name"`
	Subdomain       types.String   `tfsdk:"subdomain"`
	Hostname        types.String   `tfsdk:"hostname"`
	TTL             types.String   `tfsdk:"ttl"`
	OfferingID      types.String   `tfsdk:"offering_id"`
	CanonicalOrigin types.String   `tfsdk:"canonical_origin"`
	Revision        types.Int64    `tfsdk:"revision"`
	Status          types.String   `tfsdk:"status"`
	ExpiresAt       types.String   `tfsdk:"expires_at"`
	BoundWorkerID   types.String   `tfsdk:"bound_worker_id"`
	EndpointID      types.String   `tfsdk:"endpoint_id"`
	Timeouts        timeouts.Value `tfsdk:"timeouts"`
}

type reservationIdentityModel struct {
	ID types.String `tfsdk:"id"`
}

func (r *reservationResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker_endpoint_origin_reservation"
}

func (r *reservationResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	replace := []planmodifier.String{stringplanmodifier.RequiresReplace()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "A value-free hold on one canonical origin for one worker, taken before the worker or its endpoint exists. " +
			"The Host never hands the origin to anyone else while the reservation holds it or an endpoint that stood on it may still answer. " +
			"A reservation never changes in place: every argument replaces it.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "Reservation id, unique in the organization. Defaults to `res-` and 16 hex digits derived from `space` and `worker_name`, known in the plan. Must not start with `hostmint-`.",
				Optional:            true,
				Computed:            true,
				Validators:          reservationIDValidators(),
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown(), stringplanmodifier.RequiresReplace()},
			},
			"space": schema.StringAttribute{
				MarkdownDescription: "Space of the worker the origin is for.",
				Required:            true,
				Validators:          nameValidators(),
				PlanModifiers:       replace,
			},
			"worker_name": schema.StringAttribute{
				MarkdownDescription: "Name of the worker the origin is for; a reservation binds only a worker of this space and name.",
				Required:            true,
				Validators:          nameValidators(),
				PlanModifiers:       replace,
			},
			"subdomain": schema.StringAttribute{
				MarkdownDescription: "DNS label of the origin. Omitted, the backend's derived label for the worker is used (that address is only ever the worker's). A chosen label needs an offering that sells chosen labels (`label_not_sold`), may not take a shape the Host derives for workers or one the operator reserved (`label_reserved`), and on `workers-dev` can only be the worker's own script name (`subdomain_not_derivable`): each checked at plan.",
				Optional:            true,
				Validators: []validator.String{stringvalidator.RegexMatches(vocab.Label, "must be one lowercase DNS label"),
					stringvalidator.ConflictsWith(path.MatchRoot("hostname"))},
				PlanModifiers: replace,
			},
			"hostname": schema.StringAttribute{
				MarkdownDescription: "A custom hostname to hold instead of a label under the offering's suffix: a verified `takoform_custom_domain` of the organization, or one name under a verified wildcard. " +
					"The origin is `https://<hostname>`. Give it as `takoform_custom_domain_verification.<name>.hostname`, so that the reservation waits for the verification. " +
					"The offering must serve custom domains (`custom_domain_unsupported`); a name another organization verified fails the plan (`domain_taken`).",
				Optional:      true,
				Validators:    []validator.String{stringvalidator.RegexMatches(customDomainHostname, "must be a lowercase DNS name of at least two labels")},
				PlanModifiers: replace,
			},
			"ttl": schema.StringAttribute{
				MarkdownDescription: "How long the hold lasts while nothing publishes on it, as a duration between `1m` and `720h`. Defaults to `24h`. An activated reservation, or one whose endpoint stands, does not age.",
				Optional:            true,
				Computed:            true,
				Default:             stringdefault.StaticString("24h"),
				Validators:          []validator.String{durationBetween{min: time.Minute, max: 720 * time.Hour}},
				PlanModifiers:       replace,
			},
			"offering_id": schema.StringAttribute{
				MarkdownDescription: "The `module-worker` offering to place the origin on. May be omitted when exactly one is sold to the organization.",
				Optional:            true,
				PlanModifiers:       replace,
			},
			"canonical_origin": schema.StringAttribute{
				MarkdownDescription: "The origin held, `scheme://host[:port]`. Known at plan time: the provider asks the Host's derivation route, and a plan fails when someone else holds the origin.",
				Computed:            true,
				PlanModifiers:       []planmodifier.String{stringplanmodifier.UseStateForUnknown()},
			},
			"revision": schema.Int64Attribute{
				MarkdownDescription: "The reservation's revision; it moves when the reservation is bound, witnessed or activated.",
				Computed:            true,
			},
			"status": schema.StringAttribute{
				MarkdownDescription: "`prepared`, `bound` or `activated` (an `expired` or `released` reservation is removed from state on refresh, and the next plan creates a new one).",
				Computed:            true,
			},
			"expires_at": schema.StringAttribute{
				MarkdownDescription: "When the hold lapses if nothing publishes on it (RFC 3339).",
				Computed:            true,
			},
			"bound_worker_id": schema.StringAttribute{
				MarkdownDescription: "UID of the worker the reservation is bound to, once bound.",
				Computed:            true,
			},
			"endpoint_id": schema.StringAttribute{
				MarkdownDescription: "UID of the endpoint recorded on the reservation (its witness), once one was created on it.",
				Computed:            true,
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Update: true, Delete: true}),
		},
	}
}

func (r *reservationResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = identityschema.Schema{
		Attributes: map[string]identityschema.Attribute{
			"id": identityschema.StringAttribute{RequiredForImport: true, Description: "Reservation id."},
		},
	}
}

func (r *reservationResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
	r.origins = memoOf(req.ProviderData).origins
}

// ModifyPlan draws the default id and asks the derivation route for the canonical origin when the
// plan creates a reservation (SPEC 3.1), so that the origin is known in the plan and a taken
// origin fails the plan rather than the apply.
func (r *reservationResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.Plan.Raw.IsNull() || !req.State.Raw.IsNull() {
		return // a destroy, or an update (every argument but timeouts replaces)
	}
	var plan reservationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	if plan.ID.IsUnknown() {
		var config reservationModel
		resp.Diagnostics.Append(getConfig(ctx, req.Config, &config)...)
		if config.ID.IsNull() && !plan.Space.IsUnknown() && !plan.WorkerName.IsUnknown() && !config.Subdomain.IsUnknown() &&
			!config.Hostname.IsUnknown() && !config.OfferingID.IsUnknown() {
			// A hostname takes the subdomain's place in the id (a label has no dot, a hostname
			// has: the two never meet).
			plan.ID = types.StringValue(defaultReservationID(plan.Space.ValueString(), plan.WorkerName.ValueString(),
				config.Subdomain.ValueString()+config.Hostname.ValueString(), config.OfferingID.ValueString()))
		}
	}
	if r.client != nil && !plan.ID.IsUnknown() && !plan.Space.IsUnknown() && !plan.WorkerName.IsUnknown() &&
		!plan.Subdomain.IsUnknown() && !plan.Hostname.IsUnknown() && !plan.OfferingID.IsUnknown() {
		id := plan.ID.ValueString()
		d, err := r.client.Derive(ctx, client.DerivationRequest{Space: plan.Space.ValueString(), WorkerName: plan.WorkerName.ValueString(),
			Subdomain: strPtr(plan.Subdomain), Hostname: strPtr(plan.Hostname), OfferingID: strPtr(plan.OfferingID), OriginReservationID: &id})
		if client.IsCode(err, "domain_not_verified") {
			// The claim is most often verified in this very apply (its verification resource
			// waits before this reservation is created); its origin is known all the same, and
			// the apply refuses if the name is still not the organization's.
			plan.CanonicalOrigin = types.StringValue("https://" + plan.Hostname.ValueString())
			r.origins.record(id, plan.CanonicalOrigin.ValueString())
			resp.Diagnostics.Append(setPlan(ctx, &resp.Plan, &plan)...)
			return
		}
		if err != nil {
			addError(&resp.Diagnostics, "Unable to derive the reservation's origin", err)
			return
		}
		switch originVerdict(d) {
		case heldBySelf:
			resp.Diagnostics.AddAttributeWarning(path.Root("subdomain"), "Origin held by this organization",
				fmt.Sprintf("The origin %s is held by this organization's %s %s. If this plan replaces it (a rename or move that keeps the subdomain), "+
					"the apply releases it first and then creates this reservation. If it is not part of this plan, the apply will fail with origin_taken: "+
					"destroy or release it first.", d.CanonicalOrigin, d.HeldBy.Kind, d.HeldBy.Name))
		case heldByOther:
			resp.Diagnostics.AddAttributeError(path.Root("subdomain"), "Origin not available",
				fmt.Sprintf("The origin %s is held by another organization; the Host never hands out an origin that is held. Choose another subdomain.", d.CanonicalOrigin))
			return
		}
		plan.CanonicalOrigin = types.StringValue(d.CanonicalOrigin)
		r.origins.record(id, d.CanonicalOrigin) // for the url of an endpoint created on it
	}
	resp.Diagnostics.Append(setPlan(ctx, &resp.Plan, &plan)...)
}

// What a plan does with a derived origin.
type verdict int

const (
	available   verdict = iota
	heldBySelf          // said, not refused: see originVerdict
	heldByOther         // refused at plan
)

// originVerdict judges a derivation. An origin this organization holds is most often this
// configuration's own reservation, which this plan replaces (a rename or move that keeps the
// subdomain): the apply releases it before creating the new one. A plan cannot see that, and a
// destroy plans creates too (its pre-destroy refresh), so that is a warning; the Host still
// refuses a taken origin at apply. An origin another organization holds fails the plan.
func originVerdict(d client.Derivation) verdict {
	switch {
	case d.Available:
		return available
	case d.HeldBy != nil && d.HeldBy.Organization == "self":
		return heldBySelf
	default:
		return heldByOther
	}
}

// defaultReservationID is the id of a reservation created without one. It must be known in the
// plan and the same when the CLI plans again at apply time, with nothing carried between the two,
// so it is derived from what the reservation holds: its space and worker name (one live
// reservation per worker anyway) and, when set, its subdomain and offering. A change of subdomain
// or offering therefore changes the id, and the endpoint published through the reservation is
// replaced with it (a reservation with the same id would leave the endpoint standing on the old
// one, whose release it fences). Without either, the id is the one earlier versions derived. The
// Host lets a released id be reserved again as a new incarnation, and a plan that follows an
// interrupted create names the same id, whose own hold does not count against the origin's
// availability.
func defaultReservationID(space, worker, subdomain, offering string) string {
	text := "takoform.reservation-id.v1\x00" + space + "\x00" + worker
	if subdomain != "" || offering != "" {
		text = "takoform.reservation-id.v2\x00" + space + "\x00" + worker + "\x00" + subdomain + "\x00" + offering
	}
	sum := sha256.Sum256([]byte(text))
	return "res-" + hex.EncodeToString(sum[:])[:16]
}

func (r *reservationResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan reservationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, 5*time.Minute)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to create reservation", err)
		return
	}
	ttl, _ := time.ParseDuration(plan.TTL.ValueString())
	ttlSeconds := int64(ttl / time.Second)
	token := newToken()
	res, _, err := r.client.PutReservation(ctx, plan.ID.ValueString(), token, client.ReservationRequest{
		Space: plan.Space.ValueString(), WorkerName: plan.WorkerName.ValueString(), Subdomain: strPtr(plan.Subdomain),
		Hostname: strPtr(plan.Hostname), TTLSeconds: &ttlSeconds, OfferingID: strPtr(plan.OfferingID),
	})
	if err != nil {
		if isUnknownOutcome(err) {
			plan.CanonicalOrigin, plan.Status, plan.ExpiresAt = nullIfUnknown(plan.CanonicalOrigin), types.StringNull(), types.StringNull()
			plan.Revision, plan.BoundWorkerID, plan.EndpointID = types.Int64Null(), types.StringNull(), types.StringNull()
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to create reservation", err)
		return
	}
	if !plan.CanonicalOrigin.IsUnknown() && plan.CanonicalOrigin.ValueString() != res.CanonicalOrigin {
		resp.Diagnostics.AddWarning("Origin differs from the plan",
			fmt.Sprintf("The plan derived %s, but the Host reserved %s (its catalog changed between plan and apply).", plan.CanonicalOrigin.ValueString(), res.CanonicalOrigin))
	}
	r.fill(&plan, res)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, reservationIdentityModel{ID: plan.ID})...)
}

func (r *reservationResource) fill(m *reservationModel, res client.Reservation) {
	m.ID, m.Space, m.WorkerName = types.StringValue(res.ID), types.StringValue(res.Space), types.StringValue(res.WorkerName)
	m.CanonicalOrigin, m.Revision, m.Status = types.StringValue(res.CanonicalOrigin), types.Int64Value(res.Revision), types.StringValue(res.Status)
	m.ExpiresAt = types.StringValue(res.ExpiresAt)
	m.BoundWorkerID, m.EndpointID = types.StringNull(), types.StringNull()
	if res.BoundWorker != nil {
		m.BoundWorkerID = types.StringValue(res.BoundWorker.UID)
	}
	if res.Endpoint != nil {
		m.EndpointID = types.StringValue(res.Endpoint.UID)
	}
}

func (r *reservationResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state reservationModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	// The identity is set first: terraform before 1.12 keeps none, and the framework wants one even
	// from a Read that removes the resource.
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, reservationIdentityModel{ID: state.ID})...)
	res, err := r.client.GetReservation(ctx, state.ID.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read reservation", err)
		return
	}
	if res.Status == "expired" || res.Status == "released" {
		// SPEC 4: the next plan creates a new reservation under a new id.
		resp.State.RemoveResource(ctx)
		return
	}
	importing := state.Space.IsNull()
	if res.Hostname != nil {
		state.Hostname = types.StringValue(*res.Hostname)
	}
	if importing && res.Hostname != nil {
		if state.TTL.IsNull() {
			state.TTL = types.StringValue("24h")
		}
	} else if importing {
		// An import knows only the id: the subdomain is set only when it is not the derived
		// default, so that a configuration without one matches.
		d, err := r.client.Derive(ctx, client.DerivationRequest{Space: res.Space, WorkerName: res.WorkerName, OriginReservationID: &res.ID})
		if err == nil && d.Subdomain != res.Subdomain {
			state.Subdomain = types.StringValue(res.Subdomain)
		}
		if state.TTL.IsNull() {
			state.TTL = types.StringValue("24h") // the projection does not carry the TTL
		}
	} else if !state.Subdomain.IsNull() {
		state.Subdomain = types.StringValue(res.Subdomain)
	}
	r.fill(&state, res)
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *reservationModel) any { return reservationIdentityModel{ID: m.ID} })...)
	resp.Diagnostics.Append(adoptToken(ctx, req.Private, resp.Private, res.OwnershipToken)...)
}

// Update changes nothing on the Host: every argument but timeouts replaces the reservation.
func (r *reservationResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan reservationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	res, err := r.client.GetReservation(ctx, plan.ID.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read reservation", err)
		return
	}
	r.fill(&plan, res)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, reservationIdentityModel{ID: plan.ID})...)
}

// Delete releases the reservation under the four fences. Fences that clear by themselves are
// waited on within the timeout; the others become a diagnostic naming what to destroy first.
func (r *reservationResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state reservationModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to release reservation", err)
		return
	}
	token, gone, diags := deleteToken(ctx, req.Private, "Unable to release reservation", fmt.Sprintf("reservation %q", state.ID.ValueString()),
		func(ctx context.Context) (client.Reservation, error) {
			return r.client.GetReservation(ctx, state.ID.ValueString())
		},
		func(x client.Reservation) *string { return x.OwnershipToken })
	resp.Diagnostics.Append(diags...)
	if gone || resp.Diagnostics.HasError() {
		return
	}
	var last error
	err := waitFor(ctx, func() (bool, string, error) {
		_, err := r.client.DeleteReservation(ctx, state.ID.ValueString(), token)
		switch {
		case err == nil || client.IsNotFound(err):
			return true, "", nil
		case client.IsCode(err, "release_fenced") && onlyTransient(err):
			last = err
			return false, describe(err), nil
		}
		return false, "", err
	})
	if err != nil {
		if last != nil && ctx.Err() != nil {
			err = last
		}
		addError(&resp.Diagnostics, "Unable to release reservation", err)
	}
}

func (r *reservationResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughWithIdentity(ctx, path.Root("id"), path.Root("id"), req, resp)
}
