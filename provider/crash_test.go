package provider_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/terraform-plugin-testing/helper/resource"
	"github.com/hashicorp/terraform-plugin-testing/plancheck"
	"github.com/hashicorp/terraform-plugin-testing/terraform"
	"github.com/stretchr/testify/require"
)

// lossyProxy forwards every request to the Host; for the PUTs of one path it lets the Host answer,
// then drops the connection without passing the answer on: the Host committed, the caller never
// heard back.
type lossyProxy struct {
	*httptest.Server
	drops  atomic.Int64 // how many more answers to drop; -1 drops them all
	puts   atomic.Int64
	target string
}

func newLossyProxy(t *testing.T, hostURL, path string) *lossyProxy {
	t.Helper()
	u, err := url.Parse(hostURL)
	require.NoError(t, err)
	rp := httputil.NewSingleHostReverseProxy(u)
	p := &lossyProxy{target: path}
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPut || r.URL.Path != p.target {
			rp.ServeHTTP(w, r)
			return
		}
		p.puts.Add(1)
		rec := httptest.NewRecorder()
		rp.ServeHTTP(rec, r) // the Host does the work and commits
		if n := p.drops.Load(); n != 0 {
			p.drops.Add(-1)
			if n < 0 {
				p.drops.Store(-1)
			}
			if conn, _, err := w.(http.Hijacker).Hijack(); err == nil {
				_ = conn.Close() // the answer is lost on the way back
				return
			}
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	t.Cleanup(p.Close)
	return p
}

func lostConfig(f *fixture, endpoint string) string {
	return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {
  endpoint        = %q
  api_key         = %q
  organization_id = %q
  request_timeout = "5s"
}

resource "takoform_worker" "w" {
  space              = "lost"
  name               = "hello"
  main_module        = "index.js"
  modules            = { "index.js" = %q }
  compatibility_date = "2025-01-01"
  timeouts {
    create = "6s"
  }
}
`, endpoint, f.h.Key, f.h.Organization.ID, workerSource)
}

// TestAccLostResponseIsReplayed: the Host commits a create but its answer is lost; the provider
// resends the same request with the same token and gets the stored answer: one worker.
func TestAccLostResponseIsReplayed(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := newLossyProxy(t, f.h.URL, "/v1/spaces/lost/workers/hello")
	p.drops.Store(1)
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{{
			Config: lostConfig(f, p.URL),
			Check: func(*terraform.State) error {
				if p.puts.Load() < 2 {
					return fmt.Errorf("the create was sent %d times, want a resend", p.puts.Load())
				}
				return f.onlyWorkers(t, "lost", 1)
			},
		}},
	})
}

// TestAccLostResponseNoOrphanNoDuplicate: every answer to a create is lost until the timeout; the
// apply fails with the token saved in the (tainted) state, and the next apply deletes that object
// with its token before creating anew: never an orphan, never a duplicate.
func TestAccLostResponseNoOrphanNoDuplicate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := newLossyProxy(t, f.h.URL, "/v1/spaces/lost/workers/hello")
	p.drops.Store(-1)
	var firstUID string
	resource.Test(t, resource.TestCase{
		ProtoV6ProviderFactories: factories,
		Steps: []resource.TestStep{
			{
				Config:      lostConfig(f, p.URL),
				ExpectError: regexp.MustCompile(`(?s)Unable to create worker.*outcome is unknown.*tainted`),
			},
			{
				PreConfig: func() {
					w, err := f.api.GetWorker(ctx(t), "lost", "hello")
					require.NoError(t, err, "the lost create did commit")
					firstUID = w.UID
					p.drops.Store(0)
				},
				Config: lostConfig(f, p.URL),
				ConfigPlanChecks: resource.ConfigPlanChecks{PreApply: []plancheck.PlanCheck{
					plancheck.ExpectResourceAction(workerAddr, plancheck.ResourceActionDestroyBeforeCreate),
				}},
				Check: func(*terraform.State) error {
					w, err := f.api.GetWorker(ctx(t), "lost", "hello")
					if err != nil {
						return err
					}
					if w.UID == firstUID {
						return fmt.Errorf("the tainted worker was kept")
					}
					a, err := f.api.GetAttestation(ctx(t), firstUID)
					if err != nil || a.Status != "closed" {
						return fmt.Errorf("the first worker's deletion attestation: %+v %v", a, err)
					}
					return f.onlyWorkers(t, "lost", 1)
				},
			},
		},
	})
}

// onlyWorkers checks, in the Host's database, how many workers of the space stand.
func (f *fixture) onlyWorkers(t *testing.T, space string, want int) error {
	var n int
	if err := f.h.DB.QueryRow(ctx(t), `SELECT count(*) FROM workers WHERE organization_id = $1 AND space = $2 AND status NOT IN ('deleted')`,
		f.h.Organization.ID, space).Scan(&n); err != nil {
		return err
	}
	if n != want {
		return fmt.Errorf("%d workers stand in %s, want %d", n, space, want)
	}
	return nil
}
