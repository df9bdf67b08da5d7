package provider_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/compare"
	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// TestAccIDsAndURLKnownAtPlan: the runtime input's id (its operation id), the activation's id (its
// reservation id) and the endpoint's url and hostname are known in the create plan, and equal
// what the apply records; an endpoint replaced on a reservation that already stands knows them in
// its plan too.
func TestAccIDsAndURLKnownAtPlan(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	cfg := f.config(graph("idp", "hello", "v", 1))
	origin := `http://hello-idp-[0-9a-f]{32}\.workers\.localhost:` + f.h.EdgePort()
	host := `^hello-idp-[0-9a-f]{32}\.workers\.localhost$`
	known := []plancheck.PlanCheck{
		plancheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringRegexp(regexp.MustCompile(`^`+origin+`/$`))),
		plancheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("hostname"), knownvalue.StringRegexp(regexp.MustCompile(host))),
		plancheck.ExpectKnownValue(activationAddr, tfjsonpath.New("id"), knownvalue.StringExact(reservationID("idp", "hello"))),
	}
	sameURL := statecheck.CompareValue(compare.ValuesSame())
	mirrors := func() []statecheck.StateCheck {
		return []statecheck.StateCheck{
			statecheck.CompareValuePairs(runtimeInputAddr, tfjsonpath.New("id"), runtimeInputAddr, tfjsonpath.New("operation_id"), compare.ValuesSame()),
			statecheck.CompareValuePairs(activationAddr, tfjsonpath.New("id"), activationAddr, tfjsonpath.New("reservation_id"), compare.ValuesSame()),
			statecheck.CompareValuePairs(endpointAddr, tfjsonpath.New("url"), reservationAddr, tfjsonpath.New("canonical_origin"), originAndSlash{}),
			sameURL.AddStateValue(endpointAddr, tfjsonpath.New("url")),
		}
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		CheckDestroy:             f.checkGraphDestroyed(t),
		Steps: []resource.TestStep{
			{
				Config: cfg,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: append(known,
					plancheck.ExpectKnownValue(runtimeInputAddr, tfjsonpath.New("id"), knownvalue.StringRegexp(regexp.MustCompile(`^rip-[0-9a-f]{24}$`))))},
				ConfigStateChecks: mirrors(),
			},
			{
				// The reservation stands: the replacing endpoint's plan reads its origin.
				Config: cfg,
				Taint:  []string{endpointAddr},
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: append(known,
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionDestroyBeforeCreate),
					plancheck.ExpectResourceAction(reservationAddr, plancheck.ResourceActionNoop))},
				ConfigStateChecks: mirrors(),
			},
			{Config: cfg, ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
		},
	})
}

// originAndSlash compares an endpoint's url with its reservation's canonical origin.
type originAndSlash struct{}

func (originAndSlash) CompareValues(values ...any) error {
	if len(values) != 2 || values[0] != values[1].(string)+"/" {
		return fmt.Errorf("url %v is not the canonical origin %v and /", values[0], values[1])
	}
	return nil
}

// TestAccCLIPrintsIDs reads the CLI's own output: every resource of the graph prints its
// `[id=…]` when created and destroyed, and the plan shows the endpoint's url, not "known after
// apply".
func TestAccCLIPrintsIDs(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := `
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}
` + graph("cli", "hello", "v", 1)
	w := newWorkspace(t, h.URL, h.Key, config)
	out, err := w.run("plan", "-input=false", "-no-color", "-out=tfplan")
	require.NoError(t, err, out)
	require.Regexp(t, `\+ url +\= "http://hello-cli-[0-9a-f]{32}\.workers\.localhost:`+h.EdgePort()+`/"`, out)
	require.Regexp(t, `\+ id +\= "rip-[0-9a-f]{24}"`, out)
	out, err = w.run("apply", "-input=false", "-no-color", "tfplan")
	require.NoError(t, err, out)
	reservation := reservationID("cli", "hello")
	for _, line := range []string{
		`takoform_worker_endpoint_origin_reservation\.r: Creation complete after \S+ \[id=` + reservation + `\]`,
		`takoform_worker_runtime_input\.ri: Creation complete after \S+ \[id=rip-[0-9a-f]{24}\]`,
		`takoform_worker\.w: Creation complete after \S+ \[id=[0-9a-f-]{36}\]`,
		`takoform_worker_endpoint\.e: Creation complete after \S+ \[id=[0-9a-f-]{36}\]`,
		`takoform_worker_endpoint_activation\.a: Creation complete after \S+ \[id=` + reservation + `\]`,
	} {
		require.Regexp(t, line, out)
	}
	state, err := os.ReadFile(filepath.Join(w.dir, "terraform.tfstate"))
	require.NoError(t, err)
	require.NotContains(t, string(state), `"id": null`)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan is empty:\n%s", out)
	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Regexp(t, `takoform_worker_runtime_input\.ri: Destroying\.\.\. \[id=rip-[0-9a-f]{24}\]`, out)
	require.Regexp(t, `takoform_worker_endpoint_activation\.a: Destroying\.\.\. \[id=`+reservation+`\]`, out)
}
