package provider

import (
	"context"
	"fmt"

	"github.com/hashicorp/terraform-plugin-framework-timeouts/resource/timeouts"
	"github.com/hashicorp/terraform-plugin-framework-validators/stringvalidator"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/planmodifier"
	"github.com/hashicorp/terraform-plugin-framework/resource/schema/stringplanmodifier"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

var _ resource.ResourceWithConfigure = (*customDomainVerificationResource)(nil)

func newCustomDomainVerificationResource() resource.Resource {
	return &customDomainVerificationResource{}
}

// customDomainVerificationResource is takoform_custom_domain_verification: it waits for a custom
// domain claim to be verified (SPEC 3.7), as a certificate's validation resource waits for the
// certificate elsewhere. It changes nothing on the Host: the claim is the custom domain's.
type customDomainVerificationResource struct {
	client *client.Client
}

type customDomainVerificationModel struct {
	ID         types.String   `tfsdk:"id"`
	Hostname   types.String   `tfsdk:"hostname"`
	VerifiedAt types.String   `tfsdk:"verified_at"`
	Timeouts   timeouts.Value `tfsdk:"timeouts"`
}

func (r *customDomainVerificationResource) Metadata(_ context.Context, req resource.MetadataRequest, resp *resource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_custom_domain_verification"
}

func (r *customDomainVerificationResource) Schema(ctx context.Context, _ resource.SchemaRequest, resp *resource.SchemaResponse) {
	resp.Schema = schema.Schema{
		MarkdownDescription: "Waits, within its create timeout, until a `takoform_custom_domain` claim is verified: the Host found its TXT record. " +
			"Give its `hostname` to a reservation so that the reservation is created only once the name is the organization's. " +
			"It changes nothing on the Host; destroying it only forgets the wait. A claim that is revoked later removes it from state, and the next plan waits again.",
		Attributes: map[string]schema.Attribute{
			"id": schema.StringAttribute{
				MarkdownDescription: "The hostname.", Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown(), mirrorString{from: path.Root("hostname")}},
			},
			"hostname": schema.StringAttribute{
				MarkdownDescription: "The claimed hostname to wait for (`takoform_custom_domain.<name>.hostname`).",
				Required:            true,
				Validators:          []validator.String{stringvalidator.RegexMatches(customDomainHostname, "must be a lowercase DNS name of at least two labels, or *. and one")},
				PlanModifiers:       []planmodifier.String{stringplanmodifier.RequiresReplace()},
			},
			"verified_at": schema.StringAttribute{MarkdownDescription: "When the claim was verified (RFC 3339).", Computed: true,
				PlanModifiers: []planmodifier.String{stringplanmodifier.UseStateForUnknown()}},
		},
		Blocks: map[string]schema.Block{
			"timeouts": timeouts.Block(ctx, timeouts.Opts{Create: true}),
		},
	}
}

func (r *customDomainVerificationResource) Configure(_ context.Context, req resource.ConfigureRequest, resp *resource.ConfigureResponse) {
	r.client = configureData(req.ProviderData, &resp.Diagnostics)
}

func (r *customDomainVerificationResource) Create(ctx context.Context, req resource.CreateRequest, resp *resource.CreateResponse) {
	var plan customDomainVerificationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	timeout, diags := plan.Timeouts.Create(ctx, defaultCreateTimeout)
	resp.Diagnostics.Append(diags...)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hostname := plan.Hostname.ValueString()
	var verified client.CustomDomain
	err := waitFor(ctx, func() (bool, string, error) {
		d, err := r.client.GetCustomDomain(ctx, hostname)
		if err != nil {
			return false, "", err
		}
		last := lastCheck(d)
		switch d.Status {
		case "verified":
			verified = d
			return true, "", nil
		case "pending":
			return false, fmt.Sprintf("custom domain %q is pending: %s", hostname, last), nil
		}
		return false, "", fmt.Errorf("custom domain %q is %s: %s", hostname, d.Status, last)
	})
	if err != nil {
		addError(&resp.Diagnostics, "Custom domain not verified", fmt.Errorf("%w\n\nPublish its TXT record (takoform_custom_domain's txt_name and txt_value); the Host looks it up again with backoff", err))
		return
	}
	plan.ID, plan.VerifiedAt = plan.Hostname, stringOrNull(verified.VerifiedAt)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
}

// lastCheck words a claim's last lookup.
func lastCheck(d client.CustomDomain) string {
	for _, c := range d.Conditions {
		if c.Type == "LastCheck" {
			return c.Message
		}
	}
	return "not looked up yet"
}

// Read keeps the verification while its claim is verified; a claim revoked or gone removes it, so
// that the next plan waits again.
func (r *customDomainVerificationResource) Read(ctx context.Context, req resource.ReadRequest, resp *resource.ReadResponse) {
	var state customDomainVerificationModel
	resp.Diagnostics.Append(getState(ctx, req.State, &state)...)
	if resp.Diagnostics.HasError() {
		return
	}
	d, err := r.client.GetCustomDomain(ctx, state.Hostname.ValueString())
	if client.IsNotFound(err) || (err == nil && d.Status != "verified") {
		resp.State.RemoveResource(ctx)
		return
	}
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read custom domain", err)
		return
	}
	state.VerifiedAt = stringOrNull(d.VerifiedAt)
	resp.Diagnostics.Append(resp.State.Set(ctx, &state)...)
}

// Update only takes a new timeout.
func (r *customDomainVerificationResource) Update(ctx context.Context, req resource.UpdateRequest, resp *resource.UpdateResponse) {
	var plan customDomainVerificationModel
	resp.Diagnostics.Append(getPlan(ctx, req.Plan, &plan)...)
	if resp.Diagnostics.HasError() {
		return
	}
	resp.Diagnostics.Append(setState(ctx, &resp.State, &plan)...)
}

// Delete forgets the wait; the claim is the custom domain's to delete.
func (r *customDomainVerificationResource) Delete(context.Context, resource.DeleteRequest, *resource.DeleteResponse) {
}
