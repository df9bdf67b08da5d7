package provider_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
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
	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/customdomain/dnstest"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
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
func customDomainGraph() string {
	g := graph("shop", "front", "s3cret-value", 1)
	g = strings.Replace(g, `  worker_name = "front"
}`, `  worker_name = "front"
  hostname    = takoform_custom_domain_verification.v.hostname
}`, 1)
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
	h := testhost.Start(t, testhost.Options{DNSResolver: d.Addr, Runtime: func(c *runtime.Config) {
		c.EdgeTLS.CertFile, c.EdgeTLS.KeyFile = pair.CertFile, pair.KeyFile
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
				Config: f.config(customDomainGraph()),
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
							Config:      providerConfig(h.URL, globexKey, globex.ID) + customDomainGraph(),
							PlanOnly:    true,
							ExpectError: regexp.MustCompile(`verified by another organization`),
						}},
					})
					return nil
				},
			},
		},
	})
}
