package provider_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
)

// TestAccWorkerLogsURL: the worker's logs_url is the Host's log route for it, known after the
// create and unchanged by an empty re-plan, and it answers the worker's organization with what
// the worker printed while it served a request (what a module prints at its top level, outside
// any request, is not in its log: as on Cloudflare, a worker's log is its events').
func TestAccWorkerLogsURL(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	code := `export default { fetch() { console.log("logs-url worker loaded"); return new Response("ok"); } };`
	config := workerConfig("logged", code) + `
resource "takoform_worker_endpoint" "e" {
  space     = "dev"
  name      = "logged"
  worker    = takoform_worker.w.name
  worker_id = takoform_worker.w.id
}
`
	served := func(s *terraform.State) error {
		host := s.RootModule().Resources[endpointAddr].Primary.Attributes["hostname"]
		if status, body, _, err := f.h.Runtime.TryGet(host, "/"); err != nil || status != http.StatusOK {
			return fmt.Errorf("%s answered %d %q (%v)", host, status, body, err)
		}
		return nil
	}
	want := f.h.URL + "/v1/spaces/dev/workers/logged/logs"
	answers := func(url string) error {
		if url != want {
			return fmt.Errorf("logs_url is %q, want %q", url, want)
		}
		deadline := time.Now().Add(15 * time.Second)
		for {
			req, err := http.NewRequest(http.MethodGet, url, nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+f.h.Key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			body, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				return err
			}
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/x-ndjson" {
				return fmt.Errorf("GET logs_url answered %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
			}
			if strings.Contains(string(body), `"message":"logs-url worker loaded"`) {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("the worker's line never appeared at logs_url: %s", body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config: f.config(config),
				Check:  resource.ComposeTestCheckFunc(served, resource.TestCheckResourceAttrWith(workerAddr, "logs_url", answers)),
			},
			{Config: f.config(config), ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{plancheck.ExpectEmptyPlan()}}},
		},
	})
}
