package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

var _ datasource.DataSourceWithConfigure = (*offeringsDataSource)(nil)

func newOfferingsDataSource() datasource.DataSource { return &offeringsDataSource{} }

type offeringsDataSource struct {
	client *client.Client
}

type offeringsDataSourceModel struct {
	Offerings []offeringModel `tfsdk:"offerings"`
}

type offeringModel struct {
	ID           types.String `tfsdk:"id"`
	Kind         types.String `tfsdk:"kind"`
	Pack         types.String `tfsdk:"pack"`
	Installation types.String `tfsdk:"installation"`
	Digest       types.String `tfsdk:"digest"`
	MaxCPUMs     types.Int64  `tfsdk:"max_cpu_ms"`
	MaxMemoryMB  types.Int64  `tfsdk:"max_memory_mb"`
	KeepsLogs    types.Bool   `tfsdk:"keeps_logs"`
	// MaxBundleBytes is null on other kinds than module-worker.
	MaxBundleBytes types.Int64 `tfsdk:"max_bundle_bytes"`
	// CronDelivery is null where a worker may have no crons.
	CronDelivery types.String `tfsdk:"cron_delivery"`
	// CustomDomainsTarget is null where the offering serves no custom domains.
	CustomDomainsTarget types.String `tfsdk:"custom_domains_target"`
}

func (d *offeringsDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_offerings"
}

func (d *offeringsDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	resp.Schema = schema.Schema{
		MarkdownDescription: "The catalog of offerings the Host sells to the API key's organization.",
		Attributes: map[string]schema.Attribute{
			"offerings": schema.ListNestedAttribute{
				MarkdownDescription: "Every offering sold to the organization, in catalog order.",
				Computed:            true,
				NestedObject: schema.NestedAttributeObject{
					Attributes: map[string]schema.Attribute{
						"id":                    schema.StringAttribute{Computed: true, MarkdownDescription: "Offering id, as accepted by `offering_id`."},
						"kind":                  schema.StringAttribute{Computed: true, MarkdownDescription: "`module-worker` or `worker-endpoint`."},
						"pack":                  schema.StringAttribute{Computed: true, MarkdownDescription: "Backend pack: `selfhost`, `workers-dev` or `wfp-managed`."},
						"installation":          schema.StringAttribute{Computed: true, MarkdownDescription: "Name of the backend installation behind the offering."},
						"digest":                schema.StringAttribute{Computed: true, MarkdownDescription: "SHA-256 of the offering's canonical JSON; it changes whenever the offering or its installation does."},
						"max_cpu_ms":            schema.Int64Attribute{Computed: true, MarkdownDescription: "On a `module-worker` offering: the most `limits.cpu_ms` of a `takoform_worker` may be (null on other kinds)."},
						"max_memory_mb":         schema.Int64Attribute{Computed: true, MarkdownDescription: "On a `module-worker` offering: the most `limits.memory_mb` may be; on Cloudflare offerings the only value it may take (128). Null on other kinds."},
						"keeps_logs":            schema.BoolAttribute{Computed: true, MarkdownDescription: "Whether the Host keeps a log of the workers of this offering (`logs_url` of a `takoform_worker`): only `selfhost` offerings do."},
						"custom_domains_target": schema.StringAttribute{Computed: true, MarkdownDescription: "On a `module-worker` offering that serves custom domains: where a custom hostname's DNS points (a CNAME target, or an IP address for an A/AAAA record). Null where a reservation may not hold a custom hostname."},
						"cron_delivery":         schema.StringAttribute{Computed: true, MarkdownDescription: "On a `module-worker` offering that runs `crons`: how each tick is delivered (`at-most-once` on `selfhost`). Null where a worker may have no crons."},
						"max_bundle_bytes":      schema.Int64Attribute{Computed: true, MarkdownDescription: "On a `module-worker` offering: the most a worker's bundle may hold (module names and contents, a `.wasm` or `.bin` file's bytes), from `module_files`; inline `modules` hold at most 1032192 bytes. Null on other kinds."},
					},
				},
			},
		},
	}
}

func (d *offeringsDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.client = configureData(req.ProviderData, &resp.Diagnostics)
}

func (d *offeringsDataSource) Read(ctx context.Context, _ datasource.ReadRequest, resp *datasource.ReadResponse) {
	offerings, err := d.client.Offerings(ctx)
	if err != nil {
		resp.Diagnostics.AddError("Unable to read offerings", describe(err))
		return
	}
	state := offeringsDataSourceModel{Offerings: []offeringModel{}}
	for _, o := range offerings {
		m := offeringModel{
			ID: types.StringValue(o.ID), Kind: types.StringValue(o.Kind), Pack: types.StringValue(o.Pack),
			Installation: types.StringValue(o.Installation), Digest: types.StringValue(o.Digest),
			MaxCPUMs: types.Int64Null(), MaxMemoryMB: types.Int64Null(), KeepsLogs: types.BoolValue(o.Pack == "selfhost"),
			MaxBundleBytes: types.Int64PointerValue(o.MaxBundleBytes), CronDelivery: types.StringPointerValue(o.CronDelivery),
			CustomDomainsTarget: customDomainsTarget(o),
		}
		if c := o.Ceilings; c != nil {
			m.MaxCPUMs, m.MaxMemoryMB = types.Int64Value(c.CPUMs), types.Int64Value(c.MemoryMB)
		}
		state.Offerings = append(state.Offerings, m)
	}
	resp.Diagnostics.Append(setState(ctx, &resp.State, &state)...)
}

// customDomainsTarget is where an offering's custom hostnames point, or null.
func customDomainsTarget(o client.Offering) types.String {
	if o.CustomDomains == nil {
		return types.StringNull()
	}
	return types.StringValue(o.CustomDomains.Target)
}
