package provider

import (
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/stretchr/testify/require"
)

// An update replaces a runtime input when bindings_wo_version moves from one set value to
// another, or when the worker it was delivered to is gone; only the second alone is said in a
// warning. Setting a version on an imported input (from null) is no bump, and a create is never a
// replacement.
func TestARuntimeInputIsReplacedByABumpOrItsGoneWorker(t *testing.T) {
	t.Parallel()
	v := types.Int64Value
	null := types.Int64Null()
	for name, c := range map[string]struct {
		creating        bool
		prior, planned  types.Int64
		stranded        string
		replace, stated bool
	}{
		"create":                      {creating: true, prior: null, planned: v(1), stranded: ""},
		"unchanged":                   {prior: v(1), planned: v(1)},
		"bumped":                      {prior: v(1), planned: v(2), replace: true},
		"version set after an import": {prior: null, planned: v(1)},
		"worker gone":                 {prior: v(1), planned: v(1), stranded: "uid-1", replace: true, stated: true},
		"worker gone and bumped":      {prior: v(1), planned: v(2), stranded: "uid-1", replace: true},
		"version unknown":             {prior: v(1), planned: types.Int64Unknown(), replace: true},
	} {
		replace, stated := replacement(c.creating, c.prior, c.planned, c.stranded)
		require.Equal(t, c.replace, replace, name)
		require.Equal(t, c.stated, stated, name)
	}
}
