package provider

import (
	"context"
	"encoding/base64"
	"fmt"
	"os"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/diag"
	"github.com/hashicorp/terraform-plugin-framework/path"
	"github.com/hashicorp/terraform-plugin-framework/types"

	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// A worker's bundle comes either inline (modules: source by name) or from files (module_files:
// path by name). From files, the plan shows the paths and each module's digest instead of the
// sources, so a large or minified bundle does not fill the plan; both ways the plan carries
// module_sha256 and bundle_bytes, which move whenever a source does.

// bundle reads the worker's modules from whichever attribute holds them. known is false while the
// configuration does not know them yet (an unknown map, key or path). A file that cannot be read
// is a diagnostic on its module_files key.
func bundle(ctx context.Context, modules, files types.Map) (map[string]string, bool, diag.Diagnostics) {
	var diags diag.Diagnostics
	from := modules
	if !files.IsNull() {
		from = files
	}
	if from.IsNull() || from.IsUnknown() {
		return nil, false, diags
	}
	for _, v := range from.Elements() {
		if v.IsUnknown() {
			return nil, false, diags
		}
	}
	var values map[string]string
	if diags.Append(from.ElementsAs(ctx, &values, false)...); diags.HasError() {
		return nil, false, diags
	}
	if files.IsNull() {
		return values, true, diags
	}
	sources := make(map[string]string, len(values))
	for name, file := range values {
		b, err := os.ReadFile(file)
		if err != nil {
			diags.AddAttributeError(path.Root("module_files").AtMapKey(name), "Unable to read a module file",
				fmt.Sprintf("Module %q names the file %q, which cannot be read: %v. Paths are relative to the directory the CLI runs in; "+
					"\"${path.module}/src/index.js\" names a file beside the module's own configuration.", name, file, err))
			continue
		}
		if workerconf.BytesModule(name) {
			// A WebAssembly or data module: its bytes, base64 as the API carries them.
			sources[name] = base64.StdEncoding.EncodeToString(b)
			continue
		}
		sources[name] = string(b)
	}
	return sources, !diags.HasError(), diags
}

// bundleSize counts what the Host's request limit counts: names and sources.
func bundleSize(modules map[string]string) int { return int(workerconf.WireBytes(modules)) }

// digests is module_sha256: each module's content digest by module name, hex SHA-256, the value
// filesha256() gives for a module read from a file (a bytes module's bytes, not its base64).
func digests(modules map[string]string) types.Map {
	values := make(map[string]attr.Value, len(modules))
	for name, src := range modules {
		values[name] = types.StringValue(workerconf.ModuleDigest(name, src))
	}
	return types.MapValueMust(types.StringType, values)
}
