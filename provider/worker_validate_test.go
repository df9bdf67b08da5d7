package provider

import (
	"context"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
	"github.com/stretchr/testify/require"
)

// A worker's bundle comes from exactly one of modules and module_files: both or neither fail
// validation naming modules, and one still unknown at plan leaves the question to apply.
func TestAWorkerTakesExactlyOneOfModulesAndModuleFiles(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := newWorkerResource().(*workerResource)
	var sr resource.SchemaResponse
	r.Schema(ctx, resource.SchemaRequest{}, &sr)
	typ := sr.Schema.Type().TerraformType(ctx).(tftypes.Object)
	strMap := tftypes.Map{ElementType: tftypes.String}
	inline := tftypes.NewValue(strMap, map[string]tftypes.Value{"index.js": tftypes.NewValue(tftypes.String, "export default {};")})
	files := tftypes.NewValue(strMap, map[string]tftypes.Value{"index.js": tftypes.NewValue(tftypes.String, "testdata/no-such-file.js")})
	null := tftypes.NewValue(strMap, nil)
	unknown := tftypes.NewValue(strMap, tftypes.UnknownValue)

	validate := func(modules, moduleFiles tftypes.Value) []string {
		attrs := map[string]tftypes.Value{}
		for name, at := range typ.AttributeTypes {
			attrs[name] = tftypes.NewValue(at, nil)
		}
		attrs["space"] = tftypes.NewValue(tftypes.String, "prod")
		attrs["name"] = tftypes.NewValue(tftypes.String, "api")
		attrs["main_module"] = tftypes.NewValue(tftypes.String, "index.js")
		attrs["compatibility_date"] = tftypes.NewValue(tftypes.String, "2025-01-01")
		attrs["modules"], attrs["module_files"] = modules, moduleFiles
		var resp resource.ValidateConfigResponse
		r.ValidateConfig(ctx, resource.ValidateConfigRequest{Config: tfsdk.Config{Schema: sr.Schema, Raw: tftypes.NewValue(typ, attrs)}}, &resp)
		var summaries []string
		for _, d := range resp.Diagnostics.Errors() {
			summaries = append(summaries, d.Summary())
		}
		return summaries
	}

	require.Empty(t, validate(inline, null))
	require.Contains(t, validate(null, files), "Unable to read a module file") // the file is read, so the combination passed
	require.NotContains(t, validate(null, files), "Invalid Attribute Combination")
	require.Contains(t, validate(inline, files), "Invalid Attribute Combination")
	require.Contains(t, validate(null, null), "Invalid Attribute Combination")
	require.Empty(t, validate(unknown, null))
	require.Empty(t, validate(null, unknown))
}
