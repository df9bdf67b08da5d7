package provider_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain/dnstest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/runtimetest"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

const customDomainAddr = "takoform_custom_domain.d"

// customDomainClaim claims app.example.com.
const customDomainClaim = `
resource "takoform_custom_domain" "d" {
  hostname = "app.example.com"
}
`

// customDomainGraph is the graph of SPEC 4 for one worker on a verified custom hostname: the
// reservation takes the verification's hostname, so it is created once the name is verified.
func customDomainGraph(offering string) string {
	g := graph("shop", "front", "s3cret-value", 1)
	g = strings.Replace(g, `  worker_name = "front"
}`, `  worker_name = "front"
  hostname    = takoform_custom_domain_verification.v.hostname
  offering_id = "`+offering+`"
}`, 1)
	g = strings.Replace(g, `  name                    = "front"
`, `  name                    = "front"
  offering_id             = "`+offering+`"
`, 1)
	return customDomainClaim + `
resource "takoform_custom_domain_verification" "v" {
  hostname = takoform_custom_domain.d.hostname
  timeouts {
    create = "2m"
  }
}
` + g
}

// TestAccCustomDomain claims a custom domain, publishes its TXT record on a real DNS server the
// Host's resolver asks, and applies a worker on https://app.example.com/: the verification waits
// for the Host's checker, the endpoint's url is the custom origin, and the edge answers it over
// HTTPS for a client that trusts only the test CA. Destroy goes in order, the claim last. Another
// organization's configuration on the same name fails at plan (SPEC 3.7).
func TestAccCustomDomain(t *testing.T) {
	t.Parallel()
	requireCLI(t)
	d, err := dnstest.Start()
	require.NoError(t, err)
	t.Cleanup(d.Close)
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "edge", "*.workers.localhost", "app.example.com")
	// Two worker offerings serve custom domains, so the worker can move between them.
	h := testhost.Start(t, testhost.Options{DNSResolver: d.Addr, Runtime: func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, pair.KeyFile
	}, CatalogFor: func(node *runtimetest.Harness) *catalog.Catalog {
		serves := map[string]any{"target": "127.0.0.1"}
		doc, err := json.Marshal(map[string]any{
			"installations": []any{map[string]any{"name": "selfhost", "pack": "selfhost", "endpointSuffix": "workers.localhost",
				"edgeListen": node.Info.EdgeAddr, "scheme": "https", "runtimeUrl": node.Info.AdminURL, "runtimeTokenFile": node.Info.TokenFile}},
			"offerings": []any{
				map[string]any{"id": "shop-a", "kind": "module-worker", "installation": "selfhost", "soldTo": []string{"*"}, "customDomains": serves},
				map[string]any{"id": "shop-b", "kind": "module-worker", "installation": "selfhost", "soldTo": []string{"*"}, "customDomains": serves, "maxCpuMs": 1000},
				map[string]any{"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": []string{"*"}},
			},
		})
		require.NoError(t, err)
		path := filepath.Join(t.TempDir(), "catalog.json")
		require.NoError(t, os.WriteFile(path, doc, 0o600))
		cat, err := catalog.Load(path)
		require.NoError(t, err)
		return cat
	}})
	api, err := client.New(client.Config{Endpoint: h.URL, APIKey: h.Key, OrganizationID: h.Organization.ID, MaxRetries: 2})
	require.NoError(t, err)
	f := &fixture{h: h, api: api}

	roots := x509.NewCertPool()
	pem, err := os.ReadFile(ca.CertFile)
	require.NoError(t, err)
	require.True(t, roots.AppendCertsFromPEM(pem))
	edge := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, h.Runtime.Info.EdgeAddr)
		},
	}}

	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				// The claim is created at once, pending, with its records known.
				Config: f.config(customDomainClaim),
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(customDomainAddr, tfjsonpath.New("status"), knownvalue.StringExact("pending")),
					statecheck.ExpectKnownValue(customDomainAddr, tfjsonpath.New("txt_name"), knownvalue.StringExact("_takoform-challenge.app.example.com")),
					statecheck.ExpectKnownValue(customDomainAddr, tfjsonpath.New("dns_records").AtSliceIndex(1).AtMapKey("type"), knownvalue.StringExact("A")),
				},
				Check: func(s *terraform.State) error {
					attrs := s.RootModule().Resources[customDomainAddr].Primary.Attributes
					d.SetTXT(attrs["txt_name"], attrs["txt_value"]) // the user publishes it
					return nil
				},
			},
			{
				Config: f.config(customDomainGraph("shop-a")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"), knownvalue.StringExact("https://app.example.com")),
				}},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue("takoform_custom_domain_verification.v", tfjsonpath.New("verified_at"), knownvalue.NotNull()),
					statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringExact("https://app.example.com/")),
					statecheck.ExpectKnownValue(activationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
				},
				Check: func(s *terraform.State) error {
					resp, err := edge.Get("https://app.example.com/")
					if err != nil {
						return fmt.Errorf("GET https://app.example.com/: %w", err)
					}
					defer resp.Body.Close()
					body, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != http.StatusOK || string(body) != fmt.Sprintf("hello, %d", len("s3cret-value")) {
						return fmt.Errorf("https://app.example.com/ answered %d %q", resp.StatusCode, body)
					}
					// While this organization holds the name, another organization's
					// configuration on it fails at plan, naming nobody.
					globexKey := h.NewKey(t, "globex")
					globex, err := auth.OrganizationByName(context.Background(), h.DB, "globex")
					if err != nil {
						return err
					}
					resource.Test(t, resource.TestCase{
						ProtoV6ProviderFactories: factories,
						Steps: []resource.TestStep{{
							Config:      providerConfig(h.URL, globexKey, globex.ID) + customDomainGraph("shop-a"),
							PlanOnly:    true,
							ExpectError: regexp.MustCompile(`verified by another organization`),
						}},
					})
					return nil
				},
			},
			{
				// The worker moves to the other offering: its graph is replaced, its URL is the
				// same custom origin, and it answers there.
				Config: f.config(customDomainGraph("shop-b")),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionReplace),
					plancheck.ExpectResourceAction(customDomainAddr, plancheck.ResourceActionNoop),
					plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"), knownvalue.StringExact("https://app.example.com")),
				}},
				ConfigStateChecks: []statecheck.StateCheck{
					statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringExact("https://app.example.com/")),
					statecheck.ExpectKnownValue(workerAddr, tfjsonpath.New("offering_id"), knownvalue.StringExact("shop-b")),
				},
				Check: func(*terraform.State) error {
					resp, err := edge.Get("https://app.example.com/")
					if err != nil {
						return fmt.Errorf("GET https://app.example.com/ after the move: %w", err)
					}
					defer resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						return fmt.Errorf("https://app.example.com/ answered %d after the move", resp.StatusCode)
					}
					return nil
				},
			},
		},
	})
}
