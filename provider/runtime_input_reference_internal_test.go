package provider

import (
	"context"
	"testing"

	"github.com/hashicorp/terraform-plugin-framework/types"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
)

// TestARip1InputKeepsItsReferenceWhileItsValuesStand (SPEC 3.5): an input an earlier provider
// created with a rip1 reference plans no change while the values, nonce and target still give
// that reference, without asking the Host; other values go to the Host for a rip2 reference (here
// there is no Host, so that is an error), never to a new rip1 one.
func TestARip1InputKeepsItsReferenceWhileItsValuesStand(t *testing.T) {
	t.Parallel()
	m := runtimeInputModel{
		Space: types.StringValue("prod"), WorkerName: types.StringValue("api"), BundleName: types.StringValue("main"),
		EndpointName: types.StringValue("api"), OriginReservationID: types.StringValue("res-api"),
		CanonicalPublicOrigin: types.StringValue("https://api.example.test"), MaterialSetNonce: types.StringValue("n-1"),
	}
	values := map[string]types.String{"API_KEY": types.StringValue("hunter2")}
	standing := runtimeref.Derive("n-1", m.target(), plainBindings(values)).Reference
	r := &runtimeInputResource{}

	id, ok, err := r.reference(context.Background(), m, values, standing)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, standing, id.Reference)
	require.Nil(t, id.Canonical, "the canonical document (it holds the values) is not kept")

	_, _, err = r.reference(context.Background(), m, map[string]types.String{"API_KEY": types.StringValue("other")}, standing)
	require.ErrorContains(t, err, "not configured", "new values need the Host's commitment key")
}
