package provider

import (
	"context"
	"fmt"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/identityschema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/listplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

var (
	_ resource.ResourceWithConfigure   = (*customDomainResource)(nil)
	_ resource.ResourceWithModifyPlan  = (*customDomainResource)(nil)
	_ resource.ResourceWithImportState = (*customDomainResource)(nil)
	_ resource.ResourceWithIdentity    = (*customDomainResource)(nil)
)

func newCustomDomainResource() resource.Resource { return &customDomainResource{} }

// customDomainResource is takoform_custom_domain: the organization's claim on a DNS name (SPEC
// 3.7). Create returns at once, pending, with the records to publish, so that a configuration can
// publish them in the same apply; takoform_custom_domain_verification waits for verified.
type customDomainResource struct {
	client *client.Client
}

type customDomainModel struct {
	ID         types.String   `tfsdk:"id"`
	Hostname   types.String   `tfsdk:"hostname"`
	Status     types.String   `tfsdk:"status"`
	VerifiedAt types.String   `tfsdk:"verified_at"`
	TXTName    types.String   `tfsdk:"txt_name"`
	TXTValue   types.String   `tfsdk:"txt_value"`
	DNSRecords types.List     `tfsdk:"dns_records"`
	Timeouts   timeouts.Value `tfsdk:"timeouts"`
}

type customDomainIdentityModel struct {
	Hostname types.String `tfsdk:"hostname"`
}

// customDomainHostname is the shape of a claimable name: a lowercase A-label DNS name of at least
// two labels, or "*." and one (the Host checks the rest: public suffixes, reserved names).
var customDomainHostname = vocab.CustomDomain

var dnsRecordType = types.ObjectType{AttrTypes: map[string]attr.Type{
	"type": types.StringType, "name": types.StringType, "value": types.StringType, "offering_id": types.StringType,
}}

func (r *customDomainResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_custom_domain"
}

func (r *customDomainResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	keep := []planmodifier.String{stringplanmodifier.UseStateForUnknown()}
	resp.Schema = schema.Schema{
		MarkdownDescription: "The organization's claim on a DNS name it controls, so that a reservation may hold it as a worker's origin (`hostname` instead of `subdomain`). " +
			"It is created pending, with the records to publish in `dns_records`: a TXT record that proves control, and where to point the name for each offering that serves custom domains. " +
			"The Host looks the TXT record up when the claim is created and then with backoff; use `takoform_custom_domain_verification` to wait for it. " +
			"The first organization to verify a name holds it (`domain_taken` for the others, naming nobody). A verified name whose record is gone for 7 daily lookups is revoked.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The hostname.", Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown(), mirrorString{from: path.Root("hostname")}},
			},
			"hostname": schema.StringAttribute{
				MarkdownDescription: "The name claimed: a lowercase A-label DNS name such as `app.example.com`, or `*.` and one (a wildcard covers the names one label below it). " +
					"Not a public suffix, nor under a name the operator reserves (`domain_reserved`).",
				Required:      true,
				Validators:    []validator.String{stringvalidator.RegexMatches(customDomainHostname, "must be a lowercase DNS name of at least two labels, or *. and one")},
				PlanModifiers: []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"status": schema.StringAttribute{
				MarkdownDescription: "`pending`, `verified`, `failed` (not verified within 7 days) or `revoked`.", Computed: true,
			},
			"verified_at": schema.StringAttribute{MarkdownDescription: "When the claim was verified (RFC 3339).", Computed: true},
			"txt_name": schema.StringAttribute{
				MarkdownDescription: "The name of the TXT record to publish: `_takoform-challenge.` and the hostname (without `*.`).", Computed: true, PlanModifiers: keep,
			},
			"txt_value": schema.StringAttribute{
				MarkdownDescription: "The value of the TXT record to publish. It is the organization's for this name: deleting and claiming it again needs no new record.", Computed: true, PlanModifiers: keep,
			},
			"dns_records": schema.ListAttribute{
				MarkdownDescription: "Every record to publish: the TXT record, then a CNAME (or A/AAAA) record per offering that serves custom domains, whose `offering_id` says which. " +
					"Moving a worker to another offering keeps its URL once the name points at that offering's target.",
				Computed:      true,
				ElementType:   dnsRecordType,
				PlanModifiers: []planmodifier.List{listplanmodifier.UseStateForUnknown()},
			},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true, Delete: true}),
		},
	}
}

func (r *customDomainResource) IdentitySchema(_ context.Context, _ resource.IdentitySchemaRequest, resp *resource.IdentitySchemaResponse) {
	resp.IdentitySchema = identityschema.Schema{
		Attributes: map[string]identityschema.Attribute{
			"hostname": identityschema.StringAttribute{RequiredForImport: true, Description: "The hostname claimed."},
		},
	}
}

func (r *customDomainResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
}

// ModifyPlan replaces a claim that failed (not verified within 7 days): the Host looks at it no
// more, and a new claim under the same name starts over, with the same TXT record.
func (r *customDomainResource) ModifyPlan(ctx context.Context, req resource.ModifyPlanRequest, resp *resource.ModifyPlanResponse) {
	if req.State.Raw.IsNull() || req.Plan.Raw.IsNull() {
		return
	}
	var state customDomainModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() || state.Status.ValueString() != "failed" {
		return
	}
	var plan customDomainModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	plan.Status, plan.VerifiedAt, plan.ID = types.StringUnknown(), types.StringUnknown(), plan.Hostname
	resp.Diagnostics.Append(setPlan(ctx, &resp.Plan, &plan)...)
	resp.RequiresReplace = append(resp.RequiresReplace, path.Root("hostname"))
}

// fill copies a claim's projection into m.
func (m *customDomainModel) fill(d client.CustomDomain) {
	m.ID, m.Hostname, m.Status = types.StringValue(d.Hostname), types.StringValue(d.Hostname), types.StringValue(d.Status)
	m.VerifiedAt = stringOrNull(d.VerifiedAt)
	m.TXTName, m.TXTValue = types.StringNull(), types.StringNull()
	records := make([]attr.Value, 0, len(d.DNSRecords))
	for _, rec := range d.DNSRecords {
		if rec.Type == "TXT" && m.TXTName.IsNull() {
			m.TXTName, m.TXTValue = types.StringValue(rec.Name), types.StringValue(rec.Value)
		}
		records = append(records, types.ObjectValueMust(dnsRecordType.AttrTypes, map[string]attr.Value{
			"type": types.StringValue(rec.Type), "name": types.StringValue(rec.Name), "value": types.StringValue(rec.Value),
			"offering_id": stringOrNull(rec.OfferingID),
		}))
	}
	m.DNSRecords = types.ListValueMust(dnsRecordType, records)
}

func (r *customDomainResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan customDomainModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to claim custom domain", err)
		return
	}
	token := newToken()
	d, _, err := r.client.PutCustomDomain(ctx, plan.Hostname.ValueString(), token)
	if err != nil {
		if isUnknownOutcome(err) {
			plan.ID, plan.Status, plan.VerifiedAt = plan.Hostname, types.StringNull(), types.StringNull()
			plan.TXTName, plan.TXTValue, plan.DNSRecords = types.StringNull(), types.StringNull(), types.ListNull(dnsRecordType)
			resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
			resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
		}
		addError(&resp.Diagnostics, "Unable to claim custom domain", err)
		return
	}
	plan.fill(d)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setToken(ctx, resp.Private, token)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, customDomainIdentityModel{Hostname: plan.Hostname})...)
}

func (r *customDomainResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state customDomainModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	prior := state
	resp.Diagnostics.Append(identifyRead(ctx, resp, customDomainIdentityModel{Hostname: state.Hostname})...)
	d, err := r.client.GetCustomDomain(ctx, state.Hostname.ValueString())
	if client.IsNotFound(err) {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read custom domain", err)
		return
	}
	state.fill(d)
	resp.Diagnostics.Append(writeRead(ctx, resp, &prior, &state, func(m *customDomainModel) any { return customDomainIdentityModel{Hostname: m.Hostname} })...)
	resp.Diagnostics.Append(adoptToken(ctx, req.Private, resp.Private, d.OwnershipToken)...)
}

// Update changes nothing on the Host: the hostname replaces the claim, and timeouts are the
// provider's.
func (r *customDomainResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan customDomainModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	d, err := r.client.GetCustomDomain(ctx, plan.Hostname.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read custom domain", err)
		return
	}
	plan.fill(d)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
	resp.Diagnostics.Append(setIdentity(ctx, resp.Identity, customDomainIdentityModel{Hostname: plan.Hostname})...)
}

// Delete lets the claim go. While a reservation holds a name on it the Host refuses
// (domain_in_use); a configuration that uses the domain destroys that reservation first.
func (r *customDomainResource) Delete(ctx context.Context, req resource.DeleteRequest, resp *resource.DeleteResponse) {
	var state customDomainModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := state.Timeouts.Delete(ctx, defaultDeleteTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := r.client.RequireOwnership(ctx); err != nil {
		addError(&resp.Diagnostics, "Unable to delete custom domain", err)
		return
	}
	hostname := state.Hostname.ValueString()
	token, gone, diags := deleteToken(ctx, req.Private, "Unable to delete custom domain", fmt.Sprintf("custom domain %q", hostname),
		func(ctx context.Context) (client.CustomDomain, error) { return r.client.GetCustomDomain(ctx, hostname) },
		func(d client.CustomDomain) *string { return d.OwnershipToken })
	resp.Diagnostics.Append(diags...)
	if gone || resp.Diagnostics.HasError() {
		return
	}
	if _, err := r.client.DeleteCustomDomain(ctx, hostname, token); err != nil && !client.IsNotFound(err) {
		addError(&resp.Diagnostics, "Unable to delete custom domain", err)
	}
}

func (r *customDomainResource) ImportState(ctx context.Context, req resource.ImportStateRequest, resp *resource.ImportStateResponse) {
	resource.ImportStatePassthroughWithIdentity(ctx, path.Root("hostname"), path.Root("hostname"), req, resp)
}
