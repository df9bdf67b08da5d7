package provider_test

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/cloudflare/cfstandin"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain/dnstest"
	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// The stand-in's account, and what a wfp-managed installation on it names.
const (
	// cfSaaSZone is the stand-in's Cloudflare for SaaS zone (custom domains on wfp-managed).
	cfSaaSZone   = "0123456789abcdef0123456789abcdef"
	cfAccount    = "0123456789abcdef0123456789abcdef"
	cfSubdomain  = "acme"
	cfToken      = "cf-canary-token-5eb1c0ffee"
	cfNamespace  = "tenants"
	cfRoutingKV  = "0f2ac74b498b48028cb68387c421e279"
	cfBaseDomain = "apps.example.test"
)

// cloud is a Host selling the two Cloudflare packs beside its selfhost node, on the stand-in, or
// on a real account when TAKOFORM_CLOUDFLARE_LIVE=1 (see the README).
type cloud struct {
	*fixture
	standin *cfstandin.Server // nil on a real account
	fetch   *http.Client
	live    bool
	// dns is the DNS server the Host resolves custom domains through on the stand-in (nil live).
	dns *dnstest.Server
}

// liveAccount reports the real account the live suite runs on, or skips.
func liveAccount(t *testing.T) (token, account string) {
	if os.Getenv("TAKOFORM_CLOUDFLARE_LIVE") != "1" {
		return "", ""
	}
	token, account = os.Getenv("CLOUDFLARE_API_TOKEN"), os.Getenv("CLOUDFLARE_ACCOUNT_ID")
	if token == "" || account == "" {
		t.Fatal("TAKOFORM_CLOUDFLARE_LIVE=1 needs CLOUDFLARE_API_TOKEN and CLOUDFLARE_ACCOUNT_ID")
	}
	return token, account
}

func liveSetting(t *testing.T, name string) string {
	v := os.Getenv(name)
	if v == "" {
		t.Skipf("the live suite needs %s for this test", name)
	}
	return v
}

func newCloud(t *testing.T) *cloud {
	t.Helper()
	requireCLI(t)
	token, account := liveAccount(t)
	c := &cloud{live: token != ""}
	workersDev := map[string]any{"name": "cf-dev", "pack": "workers-dev", "routePropagationSeconds": 2}
	wfp := map[string]any{"name": "cf-wfp", "pack": "wfp-managed", "routePropagationSeconds": 2}
	if c.live {
		workersDev["accountSubdomain"] = liveSetting(t, "TAKOFORM_CLOUDFLARE_SUBDOMAIN")
		workersDev["routePropagationSeconds"], wfp["routePropagationSeconds"] = 30, 90
		wfp["baseDomain"] = os.Getenv("TAKOFORM_CLOUDFLARE_BASE_DOMAIN")
		wfp["dispatchNamespace"] = os.Getenv("TAKOFORM_CLOUDFLARE_DISPATCH_NAMESPACE")
		wfp["dispatchWorkerName"] = os.Getenv("TAKOFORM_CLOUDFLARE_DISPATCH_WORKER")
		wfp["routingKvNamespaceId"] = os.Getenv("TAKOFORM_CLOUDFLARE_ROUTING_KV")
		if zone, target := os.Getenv("TAKOFORM_CLOUDFLARE_SAAS_ZONE"), os.Getenv("TAKOFORM_CLOUDFLARE_SAAS_TARGET"); zone != "" && target != "" {
			wfp["saasZoneId"], wfp["saasCnameTarget"] = zone, target
		}
		c.fetch = http.DefaultClient
	} else {
		token, account = cfToken, cfAccount
		s, err := cfstandin.New(cfstandin.Config{
			Token: cfToken, AccountID: cfAccount, AccountSubdomain: cfSubdomain, Workerd: workerdtest.Binary(t),
			DispatchNamespaces: []string{cfNamespace}, KVNamespaces: []string{cfRoutingKV},
			BaseDomain: cfBaseDomain, RoutingKVNamespace: cfRoutingKV, RoutingDispatchNamespace: cfNamespace,
			KVStale: time.Second, SaaSZoneID: cfSaaSZone, CustomHostnameReadsToActive: 2,
		})
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Close() })
		wfp["saasZoneId"], wfp["saasCnameTarget"] = cfSaaSZone, "customers."+cfBaseDomain
		d, err := dnstest.Start()
		require.NoError(t, err)
		t.Cleanup(d.Close)
		c.dns = d
		c.standin, c.fetch = s, s.EdgeClient()
		workersDev["accountSubdomain"], workersDev["apiBaseUrl"], wfp["apiBaseUrl"] = cfSubdomain, s.BaseURL(), s.BaseURL()
		wfp["baseDomain"], wfp["dispatchNamespace"], wfp["dispatchWorkerName"], wfp["routingKvNamespaceId"] = cfBaseDomain, cfNamespace, "takoform-dispatch", cfRoutingKV
	}
	private := filepath.Join(t.TempDir(), "cf")
	require.NoError(t, safedir.Ensure(private, safedir.Current()))
	require.NoError(t, safedir.WriteFile(private, "api-token", []byte(token+"\n"), safedir.Current()))
	for _, inst := range []map[string]any{workersDev, wfp} {
		inst["accountId"], inst["apiTokenFile"] = account, filepath.Join(private, "api-token")
	}
	wfpWorker := map[string]any{"id": "cf-wfp-worker", "kind": "module-worker", "installation": "cf-wfp", "soldTo": []string{"*"}}
	if wfp["saasZoneId"] != nil {
		wfpWorker["customDomains"] = map[string]any{}
	}
	opts := testhost.Options{CatalogFor: func(node *runtimetest.Harness) *catalog.Catalog {
		doc, err := json.Marshal(map[string]any{
			"installations": []any{
				map[string]any{"name": "selfhost", "pack": "selfhost", "endpointSuffix": "workers.localhost", "edgeListen": node.Info.EdgeAddr,
					"scheme": "http", "runtimeUrl": node.Info.AdminURL, "runtimeTokenFile": node.Info.TokenFile},
				workersDev, wfp,
			},
			"offerings": []any{
				map[string]any{"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": []string{"*"}},
				map[string]any{"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": []string{"*"}},
				map[string]any{"id": "cf-dev-worker", "kind": "module-worker", "installation": "cf-dev", "soldTo": []string{"*"}},
				map[string]any{"id": "cf-dev-endpoint", "kind": "worker-endpoint", "installation": "cf-dev", "soldTo": []string{"*"}},
				wfpWorker,
				map[string]any{"id": "cf-wfp-endpoint", "kind": "worker-endpoint", "installation": "cf-wfp", "soldTo": []string{"*"}},
			},
		})
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "catalog.json")
		require.NoError(t, os.WriteFile(path, doc, 0o600))
		cat, err := catalog.Load(path)
		require.NoError(t, err)
		return cat
	}}
	if c.standin != nil {
		opts.CloudflareEdge = c.standin.EdgeClient()
		opts.DNSResolver = c.dns.Addr
	} else {
		// Live: custom domains are looked up through a public resolver (TAKOFORM_CLOUDFLARE_DNS_RESOLVER).
		opts.DNSResolver = cmp.Or(os.Getenv("TAKOFORM_CLOUDFLARE_DNS_RESOLVER"), "1.1.1.1:53")
	}
	h := testhost.Start(t, opts)
	api, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key, OrganizationID: h.Organization.ID, MaxRetries: 2})
	require.NoError(t, err)
	c.fixture = &fixture{h: h, api: api}
	return c
}

// cloudWorker answers with its code's version and its secret's SHA-256, never the secret.
const cloudWorker = `export default {
  async fetch(request, env) {
    const sum = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(env.GREETING));
    const hex = [...new Uint8Array(sum)].map((b) => b.toString(16).padStart(2, "0")).join("");
    return new Response("VERSION " + hex);
  },
};`

// cloudGraph is the quickstart graph on one Cloudflare pack's offerings; subdomain "" lets the
// Host derive the label (the script name on workers-dev, the tsw- default on wfp-managed).
func cloudGraph(offering, space, subdomain, code, secret string, version int) string {
	sub := ""
	if subdomain != "" {
		sub = fmt.Sprintf("subdomain   = %q", subdomain)
	}
	return fmt.Sprintf(`
resource "takoform_worker_endpoint_origin_reservation" "r" {
  space       = %[2]q
  worker_name = "hello"
  offering_id = "%[1]s-worker"
  %[3]s
}

resource "takoform_worker_runtime_input" "ri" {
  space                   = %[2]q
  worker_name             = "hello"
  endpoint_name           = "hello"
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.r.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.r.canonical_origin
  bindings_wo             = { GREETING = %[5]q }
  bindings_wo_version     = %[6]d
}

resource "takoform_worker" "w" {
  space                   = %[2]q
  name                    = "hello"
  offering_id             = "%[1]s-worker"
  main_module             = "index.js"
  modules                 = { "index.js" = %[4]q }
  compatibility_date      = "2025-01-01"
  required_sensitive_vars = ["GREETING"]
  runtime_input_reference = takoform_worker_runtime_input.ri.reference
}

resource "takoform_worker_endpoint" "e" {
  space                 = %[2]q
  name                  = "hello"
  offering_id           = "%[1]s-endpoint"
  worker                = takoform_worker.w.name
  worker_id             = takoform_worker.w.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.r.id
}

resource "takoform_worker_endpoint_activation" "a" {
  reservation_id = takoform_worker_endpoint_origin_reservation.r.id
  endpoint_id    = takoform_worker_endpoint.e.id
}
`, offering, space, sub, code, secret, version)
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// answers waits (within the route's propagation) until url answers want with status.
func (c *cloud) answers(url string, status int, want string) error {
	deadline := time.Now().Add(20 * time.Second)
	if c.live {
		deadline = time.Now().Add(3 * time.Minute)
	}
	var last string
	for {
		res, err := c.fetch.Get(url)
		if err == nil {
			body, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == status && strings.Contains(string(body), want) {
				return nil
			}
			last = fmt.Sprintf("%d %q", res.StatusCode, body)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s answered %s, want %d with %q", url, last, status, want)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func (c *cloud) urlAnswers(status int, want string) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		e, ok := s.RootModule().Resources[endpointAddr]
		if !ok {
			return fmt.Errorf("no endpoint in the state")
		}
		return c.answers(e.Primary.Attributes["url"], status, want)
	}
}

// TestAccQuickstartOnCloudflare applies the quickstart graph on each Cloudflare pack: the URL
// answers with the secret's digest, a code change keeps the secret, a bindings_wo_version bump
// redelivers, and destroy leaves the URL answering 404 and nothing on the account.
func TestAccQuickstartOnCloudflare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, offering, subdomain string }{
		{"workers-dev", "cf-dev", ""},
		{"wfp-managed default label", "cf-wfp", ""},
		{"wfp-managed supplied reservation", "cf-wfp", "shop"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCloud(t)
			if c.live && tc.offering == "cf-wfp" {
				liveSetting(t, "TAKOFORM_CLOUDFLARE_BASE_DOMAIN")
			}
			const first, second = "sealed-canary-first-9f3e", "sealed-canary-second-4b1d"
			v1, v2 := strings.ReplaceAll(cloudWorker, "VERSION", "v1"), strings.ReplaceAll(cloudWorker, "VERSION", "v2")
			space := "cf" + fmt.Sprint(time.Now().UnixNano()%100000)
			var url string
			resource.Test(t, resource.TestCase{
				ProtoV6ProviderFactories: factories,
				Steps: []resource.TestStep{
					{
						Config: c.config(cloudGraph(tc.offering, space, tc.subdomain, v1, first, 1)),
						Check: resource.ComposeTestCheckFunc(c.urlAnswers(http.StatusOK, "v1 "+digest(first)),
							// The Cloudflare packs keep no worker log: no URL that answers 501.
							resource.TestCheckNoResourceAttr("takoform_worker.w", "logs_url"),
							func(s *terraform.State) error {
								url = s.RootModule().Resources[endpointAddr].Primary.Attributes["url"]
								return nil
							}),
					},
					{
						Config: c.config(cloudGraph(tc.offering, space, tc.subdomain, v2, first, 1)),
						ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
							plancheck.ExpectResourceAction("takoform_worker.w", plancheck.ResourceActionUpdate),
							plancheck.ExpectResourceAction("takoform_worker_runtime_input.ri", plancheck.ResourceActionNoop),
						}},
						Check: c.urlAnswers(http.StatusOK, "v2 "+digest(first)),
					},
					{
						Config: c.config(cloudGraph(tc.offering, space, tc.subdomain, v2, second, 2)),
						Check:  c.urlAnswers(http.StatusOK, "v2 "+digest(second)),
					},
					{
						Config:           c.config(cloudGraph(tc.offering, space, tc.subdomain, v2, second, 2)),
						ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}},
					},
				},
				CheckDestroy: func(*terraform.State) error {
					if err := c.answers(url, http.StatusNotFound, ""); err != nil {
						return err
					}
					if c.standin == nil {
						return nil
					}
					if n := c.standin.ScriptNames(""); len(n) != 0 {
						return fmt.Errorf("scripts left on the account: %v", n)
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
			for _, canary := range []string{first, second, cfToken} {
				where, found := leakscan.FindString(c.h.Logs(), canary)
				require.False(t, found, "the Host's log holds no secret and no API token (%s)", where)
			}
		})
	}
}

// noCanary fails when a canary is in any attribute of the state, nested encodings included.
func noCanary(canaries ...string) resource.TestCheckFunc {
	return func(s *terraform.State) error {
		for addr, r := range s.RootModule().Resources {
			for name, v := range r.Primary.Attributes {
				for _, c := range canaries {
					if where, found := leakscan.FindString(v, c); found {
						return fmt.Errorf("%s.%s holds a canary (%s)", addr, name, where)
					}
				}
			}
		}
		return nil
	}
}

// TestAccCloudflareFaultsLeaveNoOrphanAndNoDuplicate: on workers-dev, a script Cloudflare refuses
// fails the apply with its message and leaves nothing; then answers lost after Cloudflare made the
// change (the upload, the route enablement, and at destroy the route and script deletes) and a
// burst of 429s are absorbed: the apply and the destroy succeed with one script, one route, no
// orphan, and neither the secret nor the API token in the state or the Host's log.
func TestAccCloudflareFaultsLeaveNoOrphanAndNoDuplicate(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	if c.standin == nil {
		t.Skip("faults are injected into the stand-in only")
	}
	const secret = "sealed-canary-fault-7c2e"
	good := strings.ReplaceAll(cloudWorker, "VERSION", "v1")
	inject := func(faults ...cfstandin.Fault) {
		for _, f := range faults {
			require.NoError(t, c.standin.Inject(f))
		}
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config:      c.config(cloudGraph("cf-dev", "faults", "", "export default { fetch( {", secret, 1)),
				ExpectError: regexp.MustCompile(`(?s)SyntaxError.*code deployment_failed`),
			},
			{
				PreConfig: func() {
					require.Empty(t, c.standin.ScriptNames(""), "a refused script leaves nothing")
					inject(
						cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPut, PathContains: "/workers/scripts/"},
						cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodPost, PathContains: "/subdomain"},
						cfstandin.Fault{Kind: cfstandin.FaultRateLimited, Method: http.MethodGet, Times: 6, RetryAfter: time.Second},
					)
				},
				Config: c.config(cloudGraph("cf-dev", "faults", "", good, secret, 1)),
				Check: resource.ComposeTestCheckFunc(
					c.urlAnswers(http.StatusOK, "v1 "+digest(secret)),
					func(*terraform.State) error {
						if n := c.standin.ScriptNames(""); len(n) != 1 {
							return fmt.Errorf("want one script on the account, got %v", n)
						}
						return nil
					},
					noCanary(secret, cfToken),
				),
			},
			{
				PreConfig: func() {
					inject(
						cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodDelete, PathContains: "/subdomain"},
						cfstandin.Fault{Kind: cfstandin.FaultLostAnswer, Method: http.MethodDelete, PathContains: "/workers/scripts/"},
					)
				},
				Config:  c.config(cloudGraph("cf-dev", "faults", "", good, secret, 1)),
				Destroy: true,
			},
		},
		CheckDestroy: func(*terraform.State) error {
			if n := c.standin.ScriptNames(""); len(n) != 0 {
				return fmt.Errorf("scripts left on the account: %v", n)
			}
			return nil
		},
	})
	for _, canary := range []string{secret, cfToken} {
		where, found := leakscan.FindString(c.h.Logs(), canary)
		require.False(t, found, "the Host's log holds no secret and no API token (%s)", where)
	}
	met := map[cfstandin.FaultKind]int{}
	for _, r := range c.standin.Requests() {
		met[r.Fault]++
	}
	require.Equal(t, 4, met[cfstandin.FaultLostAnswer], "every lost answer was met")
	require.Equal(t, 6, met[cfstandin.FaultRateLimited], "every 429 of the burst was met")
}

// A bundle that carries a source map fails at plan on a Cloudflare offering: only a selfhost
// offering keeps a worker log for the map to name places in (SPEC 3.6).
func TestAccASourceMapFailsAtPlanOnACloudflareOffering(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	config := `
resource "takoform_worker" "w" {
  space              = "maps"
  name               = "mapped"
  offering_id        = "cf-dev-worker"
  main_module        = "index.js"
  compatibility_date = "2025-01-01"
  modules = {
    "index.js"     = "export default { fetch() { return new Response(\"ok\") } };"
    "index.js.map" = jsonencode({ version = 3, sources = ["src/index.ts"], mappings = "AAAA" })
  }
}
`
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: c.config(config), PlanOnly: true,
			ExpectError: regexp.MustCompile(`Source maps not kept on this offering`),
		}},
	})
}

// Crons on workers-dev go to Cloudflare's schedules API (SPEC 3.6), on the stand-in or, with
// credentials, a live account: set at create, changed in place, removed by an update without
// them, and gone with the script at destroy; takoform_offerings says at-least-once.
func TestAccCronsOnWorkersDevAreCloudflaresSchedules(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	space := "cron" + fmt.Sprint(time.Now().UnixNano()%100000)
	config := func(crons string) string {
		return fmt.Sprintf(`
resource "takoform_worker" "w" {
  space              = %q
  name               = "ticks"
  offering_id        = "cf-dev-worker"
  main_module        = "index.js"
  compatibility_date = "2025-01-01"
  modules            = { "index.js" = "export default { fetch() { return new Response(\"ok\") }, scheduled() {} };" }
  %s
}

data "takoform_offerings" "all" {}

output "delivery" {
  value = [for o in data.takoform_offerings.all.offerings : o.cron_delivery if o.id == "cf-dev-worker"][0]
}
`, space, crons)
	}
	schedules := func(want ...string) resource.TestCheckFunc {
		return func(s *terraform.State) error {
			if c.standin == nil {
				return nil
			}
			sc, ok := c.standin.Script(s.RootModule().Resources["takoform_worker.w"].Primary.Attributes["script_name"])
			if !ok {
				return fmt.Errorf("no script on the account")
			}
			if !slices.Equal(sc.Schedules, want) {
				return fmt.Errorf("schedules %v, want %v", sc.Schedules, want)
			}
			return nil
		}
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: c.config(config(`crons = ["*/30 * * * *"]`)),
				Check:  resource.ComposeTestCheckFunc(schedules("*/30 * * * *"), resource.TestCheckOutput("delivery", "at-least-once")),
			},
			{
				Config:           c.config(config(`crons = ["*/30 * * * *", "0 6 * * 1"]`)),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectResourceAction("takoform_worker.w", plancheck.ResourceActionUpdate)}},
				Check:            schedules("*/30 * * * *", "0 6 * * 1"),
			},
			{Config: c.config(config("")), Check: schedules()},
		},
		CheckDestroy: func(*terraform.State) error {
			if c.standin != nil && len(c.standin.ScriptNames("")) != 0 {
				return fmt.Errorf("scripts left on the account: %v", c.standin.ScriptNames(""))
			}
			return nil
		},
	})
}

// Crons on wfp-managed, which has no schedules API for its scripts, fail at plan.
func TestAccCronsOnWFPManagedFailAtPlan(t *testing.T) {
	t.Parallel()
	c := newCloud(t)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: c.config(`
resource "takoform_worker" "w" {
  space              = "cron"
  name               = "ticks"
  offering_id        = "cf-wfp-worker"
  main_module        = "index.js"
  compatibility_date = "2025-01-01"
  modules            = { "index.js" = "export default { scheduled() {} };" }
  crons              = ["* * * * *"]
}
`), PlanOnly: true,
			ExpectError: regexp.MustCompile(`Crons not run on this offering`),
		}},
	})
}
