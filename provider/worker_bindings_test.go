package provider_test

import (
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/provider"
)

// A caller is replaced exactly when a binding it has will name a UID not known until apply (its
// callee is being replaced); a new binding, a binding moved to a known worker, or one removed is
// an update in place.
func TestACallerIsReplacedOnlyWhenABoundCalleeWillBeReplaced(t *testing.T) {
	known := func(m map[string]string) types.Map {
		v := map[string]attr.Value{}
		for k, s := range m {
			v[k] = types.StringValue(s)
		}
		return types.MapValueMust(types.StringType, v)
	}
	withUnknown := func(m map[string]string, unknown string) types.Map {
		v := known(m).Elements()
		v[unknown] = types.StringUnknown()
		return types.MapValueMust(types.StringType, v)
	}
	null := types.MapNull(types.StringType)
	for name, c := range map[string]struct {
		state, plan types.Map
		replace     bool
	}{
		"the callee is replaced":               {known(map[string]string{"AUTH": "u1"}), withUnknown(nil, "AUTH"), true},
		"the whole map will be known at apply": {known(map[string]string{"AUTH": "u1"}), types.MapUnknown(types.StringType), true},
		"a new binding to a worker being made": {known(map[string]string{"AUTH": "u1"}), withUnknown(map[string]string{"AUTH": "u1"}, "DB"), false},
		"moved to another existing worker":     {known(map[string]string{"AUTH": "u1"}), known(map[string]string{"AUTH": "u2"}), false},
		"removed":                              {known(map[string]string{"AUTH": "u1"}), null, false},
		"the first binding, callee being made": {null, withUnknown(nil, "AUTH"), false},
		"unchanged":                            {known(map[string]string{"AUTH": "u1"}), known(map[string]string{"AUTH": "u1"}), false},
		"renamed, its callee replaced":         {known(map[string]string{"AUTH": "u1"}), withUnknown(nil, "AUTH2"), true},
		"renamed, its callee kept, one new":    {known(map[string]string{"AUTH": "u1"}), withUnknown(map[string]string{"AUTH2": "u1"}, "DB"), false},
	} {
		require.Equal(t, c.replace, provider.CalleeReplaced(c.state, c.plan), name)
	}
}
