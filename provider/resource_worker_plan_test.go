package provider

import (
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/attr"
	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/stretchr/testify/require"
)

// An update plans a new generation when a module file's content moved (the digests alone say
// so) or when the Host's current generation failed; a create, or an update whose digests stand
// on a Ready worker, does not.
func TestAWorkerRedeploysWhenItsDigestsMoveOrItsGenerationFailed(t *testing.T) {
	t.Parallel()
	digests := func(sum string) types.Map {
		return types.MapValueMust(types.StringType, map[string]attr.Value{"index.js": types.StringValue(sum)})
	}
	one, two := digests("aa"), digests("bb")
	for name, c := range map[string]struct {
		creating       bool
		planned, prior types.Map
		ready          types.Bool
		want           bool
	}{
		"create":                  {creating: true, planned: one, prior: types.MapNull(types.StringType), ready: types.BoolNull()},
		"unchanged and Ready":     {planned: one, prior: one, ready: types.BoolValue(true)},
		"a file changed":          {planned: two, prior: one, ready: types.BoolValue(true), want: true},
		"digests unknown at plan": {planned: types.MapUnknown(types.StringType), prior: one, ready: types.BoolValue(true), want: true},
		"its generation failed":   {planned: one, prior: one, ready: types.BoolValue(false), want: true},
		"Ready not read yet":      {planned: one, prior: one, ready: types.BoolNull()},
	} {
		require.Equal(t, c.want, redeploys(c.creating, c.planned, c.prior, c.ready), name)
	}
}
