package provider_test

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
)

// settingsSource reads a plain var, a JSON var, a module only nodejs_compat provides, and its
// secret's length.
const settingsSource = `import { Buffer } from "node:buffer";
export default { async fetch(request, env) {
  return new Response([env.LOG_LEVEL, env.LIMITS.rps, Buffer.from("ok").toString("hex"), String(env.GREETING.length)].join(" "));
} };`

// settingsGraph is the full graph whose worker carries vars, json_vars and compatibility_flags.
func settingsGraph(settings string) string {
	g := strings.Replace(graph("conf", "vars", "s3cret-value", 1), workerSource, settingsSource, 1)
	return strings.Replace(g, `  compatibility_date      = "2025-01-01"
`, `  compatibility_date      = "2025-01-01"
`+settings, 1)
}

func answers(t *testing.T, f *fixture, want string) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		host := s.RootModule().Resources[endpointAddr].Primary.Attributes["hostname"]
		status, body, _ := f.h.Runtime.Get(t, host, "/")
		if status != http.StatusOK || body != want {
			return fmt.Errorf("%s answered %d %q, want %q", host, status, body, want)
		}
		return nil
	}
}

// vars, json_vars and compatibility_flags reach the worker; a var change is an update of the worker
// alone, in place, and the delivered secret stays without a new runtime input; a name shared with
// a secret fails at plan; a flag the runtime does not know fails the apply with its own message
// while the previous generation serves. Every apply is followed by the framework's empty re-plan.
func TestAccWorkerVarsAndCompatibilityFlags(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const flags = `  compatibility_flags     = ["nodejs_compat"]
`
	debug := f.config(settingsGraph(`  vars                    = { LOG_LEVEL = "debug" }
  json_vars               = { LIMITS = jsonencode({ rps = 5 }) }
` + flags))
	info := strings.Replace(debug, `"debug"`, `"info"`, 1)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{Config: debug, Check: answers(t, f, "debug 5 6f6b 12")},
			{
				Config: info,
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction(runtimeInputAddr, plancheck.ResourceActionNoop),
					plancheck.ExpectResourceAction(endpointAddr, plancheck.ResourceActionNoop),
				}},
				Check: answers(t, f, "info 5 6f6b 12"),
			},
			{
				Config:      strings.Replace(info, `LOG_LEVEL = "info"`, `LOG_LEVEL = "info", GREETING = "x"`, 1),
				PlanOnly:    true,
				ExpectError: regexp.MustCompile(`(?s)Invalid worker variables or flags.*GREETING.*required_sensitive_vars`),
			},
			{
				Config:      strings.Replace(info, `jsonencode({ rps = 5 })`, `"{rps: 5"`, 1),
				PlanOnly:    true,
				ExpectError: regexp.MustCompile(`(?s)json_vars LIMITS is not a JSON text`),
			},
			{
				Config:      strings.Replace(info, `["nodejs_compat"]`, `["nodejs_compat", "no_such_flag_anywhere"]`, 1),
				ExpectError: regexp.MustCompile(`(?s)No\s+such\s+compatibility\s+flag:\s+no_such_flag_anywhere.*deployment_failed`),
				Check:       answers(t, f, "info 5 6f6b 12"),
			},
			{Config: info, Check: answers(t, f, "info 5 6f6b 12")},
		},
	})
}
