package main

import (
	"context"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/resource"

	takoform "github.com/takoform/terraform-provider-takoform/provider"
)

// described is what the floor must share with a Takoform resource.
type described struct {
	schema   resource.SchemaResponse
	identity resource.IdentitySchemaResponse
}

func describe(ctx context.Context, t *testing.T, providerName string, constructors []func() resource.Resource) map[string]described {
	t.Helper()
	out := map[string]described{}
	for _, constructor := range constructors {
		r := constructor()
		var meta resource.MetadataResponse
		r.Metadata(ctx, resource.MetadataRequest{ProviderTypeName: providerName}, &meta)
		var d described
		r.Schema(ctx, resource.SchemaRequest{}, &d.schema)
		if withIdentity, ok := r.(resource.ResourceWithIdentity); ok {
			withIdentity.IdentitySchema(ctx, resource.IdentitySchemaRequest{}, &d.identity)
		}
		out[strings.TrimPrefix(meta.TypeName, providerName+"_")] = d
	}
	return out
}

// TestShapesAreTakoforms holds the floor to the Takoform provider's resources: the same resource
// names, the same attribute and block types, the same modes (required, optional, computed,
// sensitive, write-only) and the same identity types. A Takoform resource that changes shape
// fails it until the table in main.go follows.
func TestShapesAreTakoforms(t *testing.T) {
	ctx := context.Background()
	want := describe(ctx, t, "takoform", takoform.New("test")().Resources(ctx))
	got := describe(ctx, t, "zerowork", zeroProvider{}.Resources(ctx))
	if len(got) != len(want) {
		t.Fatalf("the floor has %d resources, the Takoform provider %d", len(got), len(want))
	}
	for name, w := range want {
		g, ok := got[name]
		if !ok {
			t.Errorf("the floor has no %s", name)
			continue
		}
		if gt, wt := g.schema.Schema.Type().TerraformType(ctx), w.schema.Schema.Type().TerraformType(ctx); !gt.Equal(wt) {
			t.Errorf("%s: the floor's type is %s, Takoform's %s", name, gt, wt)
		}
		for attrName, wa := range w.schema.Schema.Attributes {
			ga, ok := g.schema.Schema.Attributes[attrName]
			if !ok {
				t.Errorf("%s: the floor has no %s", name, attrName)
				continue
			}
			type modes struct{ Required, Optional, Computed, Sensitive, WriteOnly bool }
			gm := modes{ga.IsRequired(), ga.IsOptional(), ga.IsComputed(), ga.IsSensitive(), ga.IsWriteOnly()}
			wm := modes{wa.IsRequired(), wa.IsOptional(), wa.IsComputed(), wa.IsSensitive(), wa.IsWriteOnly()}
			if gm != wm {
				t.Errorf("%s.%s: the floor's modes are %+v, Takoform's %+v", name, attrName, gm, wm)
			}
		}
		if gt, wt := g.identity.IdentitySchema.Type().TerraformType(ctx), w.identity.IdentitySchema.Type().TerraformType(ctx); !gt.Equal(wt) {
			t.Errorf("%s: the floor's identity is %s, Takoform's %s", name, gt, wt)
		}
	}
}
