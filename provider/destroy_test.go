package provider_test

import (
	"fmt"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

const lonelyReservation = `
resource "takoform_worker_endpoint_origin_reservation" "r" {
  id          = "res-fenced"
  space       = "fence"
  worker_name = "hello"
}

resource "takoform_worker_runtime_input" "ri" {
  space                   = "fence"
  worker_name             = "hello"
  endpoint_name           = "hello"
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.r.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.r.canonical_origin
  bindings_wo             = { GREETING = "v" }
}
`

// TestAccReleaseFencedNamesWhatToDestroyFirst: an endpoint created on the reservation outside
// this configuration fences its release; destroy fails with the unmet fence and what to destroy
// first, and succeeds once that endpoint is gone. A runtime input aborted behind the provider's
// back is dropped on refresh and prepared again.
func TestAccReleaseFencedNamesWhatToDestroyFirst(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config(lonelyReservation)
	const workerToken, endpointToken = "outside-worker-token-01", "outside-endpoint-token-1"
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{Config: cfg},
			{
				// Drift: the runtime input is aborted behind the provider's back.
				PreConfig: func() {
					c := ctx(t)
					p, err := f.api.GetPreparationByReference(c, f.reference(t))
					require.NoError(t, err)
					_, err = f.api.DeletePreparation(c, p.OperationID, *p.OwnershipToken)
					require.NoError(t, err)
				},
				Config:           cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction(runtimeInputAddr, plancheck.ResourceActionCreate)}},
			},
			{
				PreConfig: func() {
					c := ctx(t)
					_, _, err := f.api.PutWorker(c, "fence", "hello", workerToken, 0, client.WorkerSpec{Modules: map[string]string{"index.js": workerSource},
						MainModule: "index.js", CompatibilityDate: "2025-01-01", RequiredSensitiveVars: []string{}})
					require.NoError(t, err)
					id := "res-fenced"
					_, _, err = f.api.PutEndpoint(c, "fence", "hello", endpointToken, 0, client.EndpointSpec{Worker: "hello", OriginReservationID: &id})
					require.NoError(t, err)
				},
				Config:      cfg,
				Destroy:     true,
				ExpectError: regexp.MustCompile(`(?s)Unable to release reservation.*release_fenced.*endpoint_present.*destroy that\s+takoform_worker_endpoint first`),
			},
			{
				PreConfig: func() {
					c := ctx(t)
					_, err := f.api.DeleteEndpoint(c, "fence", "hello", endpointToken)
					require.NoError(t, err)
					_, err = f.api.DeleteWorker(c, "fence", "hello", workerToken)
					require.NoError(t, err)
				},
				Config: cfg,
			},
		},
	})
}

// reference is the runtime input's reference, read through the Host (the test has no state).
func (f *fixture) reference(t *testing.T) string {
	t.Helper()
	var ref string
	err := f.h.DB.QueryRow(ctx(t), `SELECT reference FROM runtime_input_preparations WHERE organization_id = $1 AND status = 'prepared' ORDER BY created_at DESC LIMIT 1`,
		f.h.Organization.ID).Scan(&ref)
	require.NoError(t, err, fmt.Sprint("a prepared runtime input"))
	return ref
}
