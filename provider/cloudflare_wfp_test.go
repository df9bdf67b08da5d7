package provider_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/cloudflare/cloudflare-go/v6/dns"
	"github.com/cloudflare/cloudflare-go/v6/option"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// wfpBindingGraph is a callee with a CPU limit (its ?burn computes for a few hundred ms) and a
// caller bound to it, answering with the callee's reply, with the caller's Host-minted endpoint,
// all on the wfp-managed offering.
func wfpBindingGraph(space, calleeReply string, calleeCPUMs int) string {
	callee := `export default { fetch(req) {
  if (!new URL(req.url).searchParams.has("burn")) return new Response("` + calleeReply + `");
  let x = 0;
  for (let i = 0; i < 200000000; i++) { x = (x + i * 7) % 1000003; }
  return new Response("burned " + x);
} };`
	caller := `export default { async fetch(req, env) {
  const r = await env.AUTH.fetch("https://auth.internal/" + new URL(req.url).search);
  return new Response("via binding " + r.status + ": " + await r.text());
} };`
	return fmt.Sprintf(`
resource "takoform_worker" "auth" {
  space              = %[1]q
  name               = "auth"
  offering_id        = "cf-wfp-worker"
  main_module        = "index.js"
  modules            = { "index.js" = %[2]q }
  compatibility_date = "2025-01-01"
  limits             = { cpu_ms = %[4]d }
}

resource "takoform_worker" "api" {
  space              = %[1]q
  name               = "api"
  offering_id        = "cf-wfp-worker"
  main_module        = "index.js"
  modules            = { "index.js" = %[3]q }
  compatibility_date = "2025-01-01"
  service_bindings   = { AUTH = takoform_worker.auth.id }
}

resource "takoform_worker_endpoint" "api" {
  space       = %[1]q
  name        = "api"
  offering_id = "cf-wfp-endpoint"
  worker      = takoform_worker.api.name
  worker_id   = takoform_worker.api.id
}
`, space, callee, caller, calleeCPUMs)
}

// TestAccWFPServiceBindingAndCPULimit: on wfp-managed a caller answers with its callee's reply
// through its binding (the dispatch worker's Binding entrypoint); the callee's CPU limit holds
// through it; raising the limit and changing the callee's code are updates of the callee alone
// that reach the caller; destroy goes in the plan's order; no plan after an apply shows a diff.
func TestAccWFPServiceBindingAndCPULimit(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	if c.live {
		liveSetting(t, "TAKOFORM_CLOUDFLARE_BASE_DOMAIN") // with install-dispatch run by the operator
	} else {
		// What takoserver cloudflare install-dispatch uploads (its propagation check aside).
		sdk, err := cloudflare.New(cloudflare.Options{BaseURL: c.standin.BaseURL(), Token: vocab.NewSecret(cfToken)})
		require.NoError(t, err)
		inst := catalog.Installation{RoutingKVNamespaceID: cfRoutingKV, DispatchNamespace: cfNamespace}
		require.NoError(t, cloudflare.Account{ID: cfAccount}.Upload(context.Background(), sdk, "takoform-dispatch", cloudflare.DispatchUpload(inst, dispatch.MinCacheTTL)))
	}
	space := "wb" + fmt.Sprint(len(t.Name()))
	url := func(s *terraform.State) string {
		return s.RootModule().Resources["takoform_worker_endpoint.api"].Primary.Attributes["url"]
	}
	answers := func(query string, status int, want string) resource.TestCheckFunc {
		return func(s *terraform.State) error { return c.answers(url(s)+query, status, want) }
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: c.config(wfpBindingGraph(space, "auth v1", 20)),
				Check: resource.ComposeTestCheckFunc(
					answers("", http.StatusOK, "via binding 200: auth v1"),
					answers("?burn", http.StatusOK, "via binding 503:"),
					answers("?burn", http.StatusOK, "worker_exceeded_limits"),
				),
			},
			{
				Config: c.config(wfpBindingGraph(space, "auth v2", 30000)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction("takoform_worker.auth", plancheck.ResourceActionUpdate),
					plancheck.ExpectResourceAction("takoform_worker.api", plancheck.ResourceActionNoop),
				}},
				Check: resource.ComposeTestCheckFunc(
					answers("", http.StatusOK, "via binding 200: auth v2"),
					answers("?burn", http.StatusOK, "via binding 200: burned"),
				),
			},
			{
				Config:           c.config(wfpBindingGraph(space, "auth v2", 30000)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}},
			},
		},
		CheckDestroy: func(*terraform.State) error {
			if c.standin == nil {
				return nil
			}
			if n := c.standin.ScriptNames(cfNamespace); len(n) != 0 {
				return fmt.Errorf("scripts left in the dispatch namespace: %v", n)
			}
			if n := c.standin.KVKeys(cfRoutingKV); n != 0 {
				return fmt.Errorf("%d routing entries left", n)
			}
			return nil
		},
	})
}

// TestAccCustomDomainOnWFP applies the quickstart graph on wfp-managed at a verified custom domain
// (SPEC 3.7): the claim's records point the name at the SaaS zone's target, the endpoint's url is
// https://<name>/ and answers with the secret's digest once Cloudflare's custom hostname is active,
// and destroy leaves no custom hostname on the zone. On a real account (TAKOFORM_CLOUDFLARE_LIVE=1)
// it needs the SaaS zone (TAKOFORM_CLOUDFLARE_SAAS_ZONE, _SAAS_TARGET), a hostname already CNAMEd
// to the target (TAKOFORM_CLOUDFLARE_CUSTOM_HOSTNAME), and the zone of that hostname
// (TAKOFORM_CLOUDFLARE_DNS_ZONE), where the test publishes the claim's TXT record through the API
// token and deletes it afterwards.
func TestAccCustomDomainOnWFP(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	hostname, target := "shop.example.org", "customers."+cfBaseDomain
	if c.live {
		liveSetting(t, "TAKOFORM_CLOUDFLARE_SAAS_ZONE")
		hostname, target = liveSetting(t, "TAKOFORM_CLOUDFLARE_CUSTOM_HOSTNAME"), liveSetting(t, "TAKOFORM_CLOUDFLARE_SAAS_TARGET")
		liveSetting(t, "TAKOFORM_CLOUDFLARE_DNS_ZONE")
	}
	const secret = "sealed-canary-wfp-domain-77a1"
	code := strings.ReplaceAll(cloudWorker, "VERSION", "v1")
	claim := `
resource "takoform_custom_domain" "d" {
  hostname = "` + hostname + `"
}
`
	graph := claim + `
resource "takoform_custom_domain_verification" "v" {
  hostname = takoform_custom_domain.d.hostname
}
` + strings.Replace(cloudGraph("cf-wfp", "saas", "", code, secret, 1), `  offering_id = "cf-wfp-worker"
`, `  offering_id = "cf-wfp-worker"
  hostname    = takoform_custom_domain_verification.v.hostname
`, 1)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: c.config(claim),
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("takoform_custom_domain.d", tfjsonpath.New("dns_records"), knownvalue.ListPartial(map[int]knownvalue.Check{
						1: knownvalue.ObjectExact(map[string]knownvalue.Check{
							"type": knownvalue.StringExact("CNAME"), "name": knownvalue.StringExact(hostname),
							"value": knownvalue.StringExact(target), "offering_id": knownvalue.StringExact("cf-wfp-worker"),
						}),
					})),
				},
				Check: func(s *terraform.State) error {
					attrs := s.RootModule().Resources["takoform_custom_domain.d"].Primary.Attributes
					return c.publishTXT(t, attrs["txt_name"], attrs["txt_value"])
				},
			},
			{
				Config: c.config(graph),
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringExact("https://"+hostname+"/")),
				},
				Check: resource.ComposeTestCheckFunc(c.urlAnswers(http.StatusOK, "v1 "+digest(secret)), func(*terraform.State) error {
					if c.live {
						return nil
					}
					if got := c.standin.CustomHostnames(); !got[hostname] {
						return fmt.Errorf("the zone's custom hostnames are %v", got)
					}
					return nil
				}),
			},
		},
		CheckDestroy: func(*terraform.State) error {
			if c.live {
				return nil
			}
			if got := c.standin.CustomHostnames(); len(got) != 0 {
				return fmt.Errorf("custom hostnames left on the zone: %v", got)
			}
			return nil
		},
	})
}

// publishTXT publishes a TXT record as the domain's owner would: on the stand-in's DNS server, or
// on a real account in TAKOFORM_CLOUDFLARE_DNS_ZONE through the API token (deleted when the test
// ends).
func (c *cloud) publishTXT(t *testing.T, name, value string) error {
	if !c.live {
		c.dns.SetTXT(name, value)
		return nil
	}
	records := dns.NewRecordService(option.WithAPIToken(os.Getenv("CLOUDFLARE_API_TOKEN")), option.WithMaxRetries(2))
	zone := os.Getenv("TAKOFORM_CLOUDFLARE_DNS_ZONE")
	var body dns.TXTRecordParam
	body.Name.Value, body.Name.Present = name, true
	body.Content.Value, body.Content.Present = `"`+value+`"`, true
	body.TTL.Value, body.TTL.Present = dns.TTL(60), true
	body.Type.Value, body.Type.Present = dns.TXTRecordTypeTXT, true
	var p dns.RecordNewParams
	p.ZoneID.Value, p.ZoneID.Present = zone, true
	p.Body = body
	rec, err := records.New(context.Background(), p)
	if err != nil {
		return fmt.Errorf("publish the TXT record %s: %w", name, err)
	}
	t.Cleanup(func() {
		var d dns.RecordDeleteParams
		d.ZoneID.Value, d.ZoneID.Present = zone, true
		_, _ = records.Delete(context.Background(), rec.ID, d)
	})
	return nil
}
