package provider

import (
	"context"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/resource"
	"github.com/hashicorp/terraform-plugin-framework/tfsdk"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/hashicorp/terraform-plugin-go/tftypes"
	"github.com/stretchr/testify/require"
)

// A Read whose prior state carries no identity (state written before identities) sets one, since
// the framework refuses a Read that ends without; one that has its identity keeps it untouched.
func TestAReadSetsAnIdentityOnlyWhereThePriorStateHasNone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := spaceNameIdentitySchema("worker")
	typ := schema.Type().TerraformType(ctx)
	ident := spaceNameIdentityModel{Space: types.StringValue("prod"), Name: types.StringValue("api")}
	asValue := func(space, name string) tftypes.Value {
		return tftypes.NewValue(typ, map[string]tftypes.Value{"space": tftypes.NewValue(tftypes.String, space), "name": tftypes.NewValue(tftypes.String, name)})
	}

	none := &resource.ReadResponse{Identity: &tfsdk.ResourceIdentity{Schema: schema, Raw: tftypes.NewValue(typ, nil)}}
	require.False(t, identifyRead(ctx, none, ident).HasError())
	require.True(t, none.Identity.Raw.Equal(asValue("prod", "api")), "no identity was set: %s", none.Identity.Raw)

	// An identity already there is left as it is (the framework refuses a changed one anyway).
	held := &resource.ReadResponse{Identity: &tfsdk.ResourceIdentity{Schema: schema, Raw: asValue("prod", "kept")}}
	require.False(t, identifyRead(ctx, held, ident).HasError())
	require.True(t, held.Identity.Raw.Equal(asValue("prod", "kept")))

}
