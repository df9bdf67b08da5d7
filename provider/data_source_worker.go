package provider

import (
	"context"

	"github.com/hashicorp/terraform-plugin-framework/datasource"
	"github.com/hashicorp/terraform-plugin-framework/datasource/schema"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

var _ datasource.DataSourceWithConfigure = (*workerDataSource)(nil)

func newWorkerDataSource() datasource.DataSource { return &workerDataSource{} }

// workerDataSource reads one worker by space and name.
type workerDataSource struct {
	client *client.Client
}

type workerDataSourceModel struct {
	Space                 types.String `tfsdk:"space"`
	Name                  types.String `tfsdk:"name"`
	ID                    types.String `tfsdk:"id"`
	MainModule            types.String `tfsdk:"main_module"`
	CompatibilityDate     types.String `tfsdk:"compatibility_date"`
	RequiredSensitiveVars types.Set    `tfsdk:"required_sensitive_vars"`
	RuntimeInputReference types.String `tfsdk:"runtime_input_reference"`
	RuntimeInputStatus    types.String `tfsdk:"runtime_input_status"`
	OfferingID            types.String `tfsdk:"offering_id"`
	Revision              types.Int64  `tfsdk:"revision"`
	Generation            types.Int64  `tfsdk:"generation"`
	ScriptName            types.String `tfsdk:"script_name"`
	Ready                 types.Bool   `tfsdk:"ready"`
}

func (d *workerDataSource) Metadata(_ context.Context, req datasource.MetadataRequest, resp *datasource.MetadataResponse) {
	resp.TypeName = req.ProviderTypeName + "_worker"
}

func (d *workerDataSource) Schema(_ context.Context, _ datasource.SchemaRequest, resp *datasource.SchemaResponse) {
	computed := func(desc string) schema.StringAttribute {
		return schema.StringAttribute{Computed: true, MarkdownDescription: desc}
	}
	resp.Schema = schema.Schema{
		MarkdownDescription: "Reads one worker of the API key's organization, its readiness derived by the Host now. Module sources are not read back.",
		Attributes: map[string]schema.Attribute{
			"space":                   schema.StringAttribute{Required: true, MarkdownDescription: "Space of the worker.", Validators: nameValidators()},
			"name":                    schema.StringAttribute{Required: true, MarkdownDescription: "Name of the worker.", Validators: nameValidators()},
			"id":                      computed("The worker's UID."),
			"main_module":             computed("Name of the entry module."),
			"compatibility_date":      computed("Workers runtime compatibility date."),
			"required_sensitive_vars": schema.SetAttribute{Computed: true, ElementType: types.StringType, MarkdownDescription: "Names of the secret bindings the worker requires."},
			"runtime_input_reference": computed("Reference of the runtime input the worker consumes, if any."),
			"runtime_input_status":    computed("Status of that runtime input (`settled` once delivered to this worker)."),
			"offering_id":             computed("The offering the worker runs on."),
			"revision":                schema.Int64Attribute{Computed: true, MarkdownDescription: "The worker's revision."},
			"generation":              schema.Int64Attribute{Computed: true, MarkdownDescription: "The worker's generation."},
			"script_name":             computed("The backend's script name for the worker."),
			"ready":                   schema.BoolAttribute{Computed: true, MarkdownDescription: "Whether the worker is Ready now."},
		},
	}
}

func (d *workerDataSource) Configure(_ context.Context, req datasource.ConfigureRequest, resp *datasource.ConfigureResponse) {
	d.client = configureData(req.ProviderData, &resp.Diagnostics)
}

func (d *workerDataSource) Read(ctx context.Context, req datasource.ReadRequest, resp *datasource.ReadResponse) {
	var m workerDataSourceModel
	resp.Diagnostics.Append(getConfig(ctx, req.Config, &m)...)
	if resp.Diagnostics.HasError() {
		return
	}
	w, err := d.client.GetWorker(ctx, m.Space.ValueString(), m.Name.ValueString())
	if err != nil {
		addError(&resp.Diagnostics, "Unable to read worker", err)
		return
	}
	m.ID, m.MainModule, m.CompatibilityDate = types.StringValue(w.UID), types.StringValue(w.MainModule), types.StringValue(w.CompatibilityDate)
	m.RequiredSensitiveVars, _ = types.SetValueFrom(ctx, types.StringType, w.RequiredSensitiveVars)
	m.RuntimeInputReference, m.RuntimeInputStatus = types.StringNull(), types.StringNull()
	if w.RuntimeInputs != nil {
		m.RuntimeInputReference, m.RuntimeInputStatus = types.StringValue(w.RuntimeInputs.Reference), types.StringValue(w.RuntimeInputs.Status)
	}
	m.OfferingID, m.Revision, m.Generation = types.StringValue(w.OfferingID), types.Int64Value(w.Revision), types.Int64Value(w.Generation)
	m.ScriptName, m.Ready = types.StringValue(w.ScriptName), types.BoolValue(w.Ready)
	resp.Diagnostics.Append(setState(ctx, &resp.State, &m)...)
}
