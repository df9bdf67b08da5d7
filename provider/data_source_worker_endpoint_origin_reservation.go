package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

var _ datasource.DataSourceWithConfigure = (*reservationDataSource)(nil)

func newReservationDataSource() datasource.DataSource { return &reservationDataSource{} }

// reservationDataSource reads one reservation by id, Host-minted ones too.
type reservationDataSource struct {
	client *client.Client
}

type reservationDataSourceModel struct {
	ID              types.String `tfsdk:"id"`
	Space           types.String `tfsdk:"space"`
	WorkerName      types.String `tfsdk:"worker_name"`
	Subdomain       types.String `tfsdk:"subdomain"`
	Hostname        types.String `tfsdk:"hostname"`
	CanonicalOrigin types.String `tfsdk:"canonical_origin"`
	Revision        types.Int64  `tfsdk:"revision"`
	Status          types.String `tfsdk:"status"`
	ExpiresAt       types.String `tfsdk:"expires_at"`
	HostMinted      types.Bool   `tfsdk:"host_minted"`
	BoundWorkerID   types.String `tfsdk:"bound_worker_id"`
	EndpointID      types.String `tfsdk:"endpoint_id"`
}

func (d *reservationDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker_endpoint_origin_reservation"
}

func (d *reservationDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	computed := func(desc string) schema.StringAttribute {
		return schema.StringAttribute{Computed: true, MarkdownDescription: desc}
	}
	resp.Schema = schema.Schema{
		MarkdownDescription: "Reads one reservation of the API key's organization by id, Host-minted reservations (`hostmint-…`) included.",
		Attributes: map[string]schema.Attribute{
			"id":               schema.StringAttribute{Required: true, MarkdownDescription: "The reservation id."},
			"space":            computed("Space of the worker the origin is for."),
			"worker_name":      computed("Name of the worker the origin is for."),
			"subdomain":        computed("DNS label of the origin (empty when it holds a custom hostname)."),
			"hostname":         computed("The custom hostname the reservation holds, or null."),
			"canonical_origin": computed("The origin held, `scheme://host[:port]`."),
			"revision":         schema.Int64Attribute{Computed: true, MarkdownDescription: "The reservation's revision."},
			"status":           computed("`prepared`, `bound`, `activated` or `expired`."),
			"expires_at":       computed("When the hold lapses if nothing publishes on it (RFC 3339)."),
			"host_minted":      schema.BoolAttribute{Computed: true, MarkdownDescription: "Whether the Host minted the reservation for an endpoint created without one."},
			"bound_worker_id":  computed("UID of the worker the reservation is bound to, once bound."),
			"endpoint_id":      computed("UID of the endpoint recorded on the reservation, once one was created on it."),
		},
	}
}

func (d *reservationDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.client = configureData(req.ProviderData, &resp.Diagnostics)
}

func (d *reservationDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var m reservationDataSourceModel
	resp.Diagnostics.Append(getConfig(ctx, req.Config, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	res, err := d.client.GetReservation(ctx, m.ID.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read reservation", err)
		return
	}
	m.Space, m.WorkerName, m.Subdomain = types.StringValue(res.Space), types.StringValue(res.WorkerName), types.StringValue(res.Subdomain)
	m.Hostname = stringOrNull(res.Hostname)
	m.CanonicalOrigin, m.Revision, m.Status = types.StringValue(res.CanonicalOrigin), types.Int64Value(res.Revision), types.StringValue(res.Status)
	m.ExpiresAt, m.HostMinted = types.StringValue(res.ExpiresAt), types.BoolValue(res.HostMinted)
	m.BoundWorkerID, m.EndpointID = types.StringNull(), types.StringNull()
	if res.BoundWorker != nil {
		m.BoundWorkerID = types.StringValue(res.BoundWorker.UID)
	}
	if res.Endpoint != nil {
		m.EndpointID = types.StringValue(res.Endpoint.UID)
	}
	resp.Diagnostics.Append(setState(ctx, &resp.State, &m)...)
}
