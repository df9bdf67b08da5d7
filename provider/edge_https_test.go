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
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/knownvalue"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/statecheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/hashicorp/terraform-plugin-testing/tfjsonpath"
	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/client"
	"github.com/takoform/terraform-provider-takoform/internal/runtime"
	"github.com/takoform/terraform-provider-takoform/internal/testhost"
	"github.com/takoform/terraform-provider-takoform/internal/testpki"
)

// TestAccHTTPSInstallation applies a worker and its endpoint on a selfhost installation with
// scheme https, whose edge serves the test CA's wildcard certificate for the suffix: the origin is
// https:// from plan to state, and the endpoint's url answers over HTTPS (HTTP/2) through the edge
// for a client that trusts only the test CA (a custom dialer stands in for DNS).
func TestAccHTTPSInstallation(t *testing.T) {
	t.Parallel()
	requireCLI(t)
	ca := testpki.NewCA(t, "edge")
	pair := ca.Server(t, "wildcard", "*.workers.localhost")
	h := testhost.Start(t, testhost.Options{Runtime: func(c *runtime.Config) {
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
		TLSClientConfig:   &tls.Config{RootCAs: roots},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, h.Runtime.Info.EdgeAddr)
		},
	}}

	origin := `^https://hello-tls-[0-9a-f]{32}\.workers\.localhost:` + h.EdgePort()
	cfg := f.config(graph("tls", "hello", "s3cret-value", 1))
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: cfg,
			ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
				plancheck.ExpectKnownValue(reservationAddr, tfjsonpath.New("canonical_origin"), knownvalue.StringRegexp(regexp.MustCompile(origin+`$`))),
			}},
			ConfigStateChecks: []statecheck.StateCheck{
				statecheck.ExpectKnownValue(endpointAddr, tfjsonpath.New("url"), knownvalue.StringRegexp(regexp.MustCompile(origin+`/$`))),
				statecheck.ExpectKnownValue(activationAddr, tfjsonpath.New("status"), knownvalue.StringExact("activated")),
			},
			Check: func(s *terraform.State) error {
				url := s.RootModule().Resources[endpointAddr].Primary.Attributes["url"]
				resp, err := edge.Get(url)
				if err != nil {
					return fmt.Errorf("GET %s: %w", url, err)
				}
				defer resp.Body.Close()
				body, _ := io.ReadAll(resp.Body)
				if resp.StatusCode != http.StatusOK || string(body) != fmt.Sprintf("hello, %d", len("s3cret-value")) || resp.ProtoMajor != 2 {
					return fmt.Errorf("%s answered %s %d %q", url, resp.Proto, resp.StatusCode, body)
				}
				return nil
			},
		}},
	})
}
