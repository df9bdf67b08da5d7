// Package provider is the Takoform Terraform/OpenTofu provider. It reaches the Host only through
// internal/client.
package provider

import (
	"context"
	"os"
	"time"

	"github.com/hashicorp/terraform-plugin-framework-validators/int64validator"
	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/provider"
	"github.com/hashicorp/terraform-plugin-framework/provider/schema"
	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/schema/validator"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-log/tflog"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// Address is the provider's registry address.
const Address = "registry.terraform.io/takoform/takoform"

// Defaults of the provider block.
const (
	defaultRequestTimeout = 30 * time.Second
	defaultMaxRetries     = 4
)

var _ provider.Provider = (*takoformProvider)(nil)

// New returns a constructor of the provider at version.
func New(version string) func() provider.Provider {
	return func() provider.Provider { return &takoformProvider{version: version} }
}

type takoformProvider struct {
	version string
}

type takoformProviderModel struct {
	Endpoint       types.String `tfsdk:"endpoint"`
	APIKey         types.String `tfsdk:"api_key"`
	OrganizationID types.String `tfsdk:"organization_id"`
	RequestTimeout types.String `tfsdk:"request_timeout"`
	MaxRetries     types.Int64  `tfsdk:"max_retries"`
	Unreachable    types.String `tfsdk:"unreachable_timeout"`
}

func (p *takoformProvider) Metadata(_ context.Context, _ provider.MetadataRequest, resp *provider.MetadataResponse) {
	resp.TypeName = "takoform"
	resp.Version = p.version
}

func (p *takoformProvider) Schema(_ context.Context, _ provider.SchemaRequest, resp *provider.SchemaResponse) {
	resp.Schema = schema.Schema{
		MarkdownDescription: "Declare edge workers, their public endpoints and their secrets on a Takoform Host.",
		Attributes: map[string]schema.Attribute{
			"endpoint": schema.StringAttribute{
				MarkdownDescription: "Base URL of the Takoform Host, such as `http://127.0.0.1:8080`. Defaults to the `TAKOFORM_ENDPOINT` environment variable.",
				Optional:            true,
			},
			"api_key": schema.StringAttribute{
				MarkdownDescription: "Organization API key. Defaults to the `TAKOFORM_API_KEY` environment variable. The organization of every object comes from this key.",
				Optional:            true,
				Sensitive:           true,
			},
			"organization_id": schema.StringAttribute{
				MarkdownDescription: "Optional: the organization the API key must belong to (`org_…`), or the `TAKOFORM_ORGANIZATION_ID` environment variable. The Host states the key's organization in `GET /v1/capabilities`, which is where `takoform_worker_runtime_input` takes it from; when this is set and differs, the provider refuses to change anything.",
				Optional:            true,
			},
			"request_timeout": schema.StringAttribute{
				MarkdownDescription: "Timeout of one HTTP request to the Host, as a Go duration (`30s`, `2m`). Defaults to `30s`.",
				Optional:            true,
				Validators:          []validator.String{durationValidator{}},
			},
			"max_retries": schema.Int64Attribute{
				MarkdownDescription: "How many times a read answered with 429, a 5xx status or a retryable 409 is retried, with backoff and `Retry-After`. Defaults to `4`. A Host that gives no answer at all is retried until `unreachable_timeout`, for reads as for everything else; one that answers `503 unavailable` (its database is down, as during a managed PostgreSQL failover) is retried for 2 minutes, or `unreachable_timeout` when longer, without counting against `max_retries`. Creates, updates and deletes are replay-safe (they always resend the same ownership token) and are retried until the resource's timeout instead (or, while the Host gives no answer at all and the request never reached it, until `unreachable_timeout`).",
				Optional:            true,
				Validators:          []validator.Int64{int64validator.Between(0, 20)},
			},
			"unreachable_timeout": schema.StringAttribute{
				MarkdownDescription: "How long a read, a plan, or a request that never reached the Host, keeps being retried while the Host gives no answer at all (connection refused or reset, no answer within `request_timeout`), as a Go duration. Past it the operation fails with an error naming the endpoint, even when the resource's own timeout is further away. A create, update or delete that was sent (it may have landed) is not failed by it: it is replayed with its ownership token until the resource's timeout. Meanwhile the provider logs a warning every quarter of it, at most every 30 seconds (shown with `TF_LOG=WARN`). A provider cannot show progress while a resource operation runs, so this error is how the CLI's output says the Host is silent. Each try lasts at most half of it, so a Host busy with a long call (a deploy) is asked again within the bound and answers the replay. Re-running the apply once the Host is back is safe: every create, update and delete is replayed under the same ownership token. Defaults to `30s`; raise it to ride out longer Host restarts.",
				Optional:            true,
				Validators:          []validator.String{durationValidator{}},
			},
		},
	}
}

func (p *takoformProvider) Configure(ctx context.Context, req provider.ConfigureRequest, resp *provider.ConfigureResponse) {
	var cfg takoformProviderModel
	resp.Diagnostics.Append(getConfig(ctx, req.Config, &cfg)...)
	if resp.Diagnostics.HasError() {
		return
	}
	for attr, value := range map[string]types.String{"endpoint": cfg.Endpoint, "api_key": cfg.APIKey, "organization_id": cfg.OrganizationID} {
		if value.IsUnknown() {
			resp.Diagnostics.AddAttributeError(path.Root(attr), "Unknown provider configuration",
				"The provider's "+attr+" is not known until apply; set it from a value known at plan time or from the environment.")
		}
	}
	if resp.Diagnostics.HasError() {
		return
	}
	endpoint, endpointFrom := os.Getenv("TAKOFORM_ENDPOINT"), "TAKOFORM_ENDPOINT"
	if !cfg.Endpoint.IsNull() {
		endpoint, endpointFrom = cfg.Endpoint.ValueString(), "the provider's endpoint attribute"
	}
	apiKey := os.Getenv("TAKOFORM_API_KEY")
	if !cfg.APIKey.IsNull() {
		apiKey = cfg.APIKey.ValueString()
	}
	orgID := os.Getenv("TAKOFORM_ORGANIZATION_ID")
	if !cfg.OrganizationID.IsNull() {
		orgID = cfg.OrganizationID.ValueString()
	}
	timeout := defaultRequestTimeout
	if !cfg.RequestTimeout.IsNull() && !cfg.RequestTimeout.IsUnknown() {
		timeout, _ = time.ParseDuration(cfg.RequestTimeout.ValueString())
	}
	unreachable := client.DefaultUnreachable
	if !cfg.Unreachable.IsNull() && !cfg.Unreachable.IsUnknown() {
		unreachable, _ = time.ParseDuration(cfg.Unreachable.ValueString())
	}
	retries := int64(defaultMaxRetries)
	if !cfg.MaxRetries.IsNull() && !cfg.MaxRetries.IsUnknown() {
		retries = cfg.MaxRetries.ValueInt64()
	}
	c, err := client.New(client.Config{
		Endpoint:       endpoint,
		APIKey:         apiKey,
		OrganizationID: orgID,
		Timeout:        timeout,
		MaxRetries:     int(retries),
		UserAgent:      "terraform-provider-takoform/" + p.version,
		Log: func(ctx context.Context, msg string, fields map[string]any) {
			tflog.Debug(ctx, msg, fields)
		},
		// A resource's RPC shows nothing in the CLI until it ends (no progress messages exist
		// for resources), so the wait on a silent Host is bounded and said in the log.
		Unreachable:  unreachable,
		EndpointFrom: endpointFrom,
		Warn: func(ctx context.Context, msg string, fields map[string]any) {
			tflog.Warn(ctx, msg, fields)
		},
	})
	if err != nil {
		resp.Diagnostics.AddError("Unable to configure the Takoform provider", err.Error())
		return
	}
	// One client per configuration: OpenTofu's provider for_each makes several in one process.
	data := &providerData{client: c, memo: planMemo{origins: &planned[string]{}, bindings: &planned[[]string]{}, offerings: &offeringsMemo{}, workers: &planned[string]{}}}
	resp.DataSourceData = data
	resp.ResourceData = data
}

func (p *takoformProvider) Resources(context.Context) []func() resource.Resource {
	return []func() resource.Resource{
		newReservationResource,
		newRuntimeInputResource,
		newWorkerResource,
		newEndpointResource,
		newActivationResource,
		newCustomDomainResource,
		newCustomDomainVerificationResource,
	}
}

func (p *takoformProvider) DataSources(context.Context) []func() datasource.DataSource {
	return []func() datasource.DataSource{newOfferingsDataSource, newReservationDataSource, newWorkerDataSource}
}

// durationValidator accepts a positive Go duration.
type durationValidator struct{}

func (durationValidator) Description(context.Context) string {
	return "must be a positive duration such as 30s or 2m"
}

func (v durationValidator) MarkdownDescription(ctx context.Context) string { return v.Description(ctx) }

func (v durationValidator) ValidateString(ctx context.Context, req validator.StringRequest, resp *validator.StringResponse) {
	if req.ConfigValue.IsNull() || req.ConfigValue.IsUnknown() {
		return
	}
	d, err := time.ParseDuration(req.ConfigValue.ValueString())
	if err != nil || d <= 0 {
		resp.Diagnostics.AddAttributeError(req.Path, "Invalid duration", "The value "+v.Description(ctx)+".")
	}
}
