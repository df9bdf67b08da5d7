package cloudflare

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/cloudflare/cloudflare-go/v6/custom_hostnames"
)

// Custom domains on wfp-managed (SPEC 3.7): a hostname outside the installation's base domain is
// a user's verified custom domain, which Cloudflare serves through a Cloudflare for SaaS custom
// hostname of the operator's zone (saasZoneId). The zone's */* route reaches the dispatch worker,
// which looks the hostname up in the routing KV namespace like any other. So an endpoint on a
// custom domain is a custom hostname plus the routing entry, Ready once the custom hostname's
// status and its certificate's both read active and the dispatch worker answers for it.

// codeDuplicateCustomHostname is Cloudflare's "Duplicate custom hostname found."
const codeDuplicateCustomHostname = 1406

// customHostname is a custom hostname as read back.
type customHostname struct {
	ID, Status, SSLStatus string
}

// active reports whether Cloudflare serves the hostname with its certificate.
func (h customHostname) active() bool { return h.Status == "active" && h.SSLStatus == "active" }

// isCustom reports whether hostname is a custom domain rather than a label under the base domain.
func (r wfpRoutes) isCustom(hostname string) bool {
	return !strings.HasSuffix(hostname, "."+r.inst.BaseDomain)
}

// readHostname reads hostname's custom hostname back (nil: none).
func (r wfpRoutes) readHostname(ctx context.Context, sdk *Services, hostname string) (*customHostname, error) {
	var p custom_hostnames.CustomHostnameListParams
	p.ZoneID.Value, p.ZoneID.Present = r.inst.SaaSZoneID, true
	p.Hostname.Value, p.Hostname.Present = custom_hostnames.CustomHostnameListParamsHostname{}, true
	p.Hostname.Value.Contain.Value, p.Hostname.Value.Contain.Present = hostname, true
	var found *customHostname
	if err := r.call(ctx, func() error {
		list, err := sdk.CustomHostnames.List(ctx, p)
		if err != nil {
			return err
		}
		found = nil
		for _, h := range list.Result {
			if h.Hostname == hostname {
				found = &customHostname{ID: h.ID, Status: string(h.Status), SSLStatus: string(h.SSL.Status)}
			}
		}
		return nil
	}); err != nil {
		return nil, r.classify(err)
	}
	return found, nil
}

// ensureHostname makes hostname's custom hostname exist and returns it as read back. It reads
// first, so that a create whose answer was lost is not made twice; a create that meets one made
// meanwhile (Cloudflare's duplicate) reads it.
func (r wfpRoutes) ensureHostname(ctx context.Context, sdk *Services, hostname string) (*customHostname, error) {
	if r.inst.SaaSZoneID == "" {
		return nil, fmt.Errorf("wfp-managed backend: %s is a custom domain, but installation %s names no saasZoneId to serve it through", hostname, r.inst.Name)
	}
	h, err := r.readHostname(ctx, sdk, hostname)
	if err != nil || h != nil {
		return h, err
	}
	var p custom_hostnames.CustomHostnameNewParams
	p.ZoneID.Value, p.ZoneID.Present = r.inst.SaaSZoneID, true
	p.Hostname.Value, p.Hostname.Present = hostname, true
	var ssl custom_hostnames.CustomHostnameNewParamsSSL
	ssl.Method.Value, ssl.Method.Present = custom_hostnames.DCVMethodHTTP, true
	ssl.Type.Value, ssl.Type.Present = custom_hostnames.DomainValidationTypeDv, true
	p.SSL.Value, p.SSL.Present = ssl, true
	err = r.call(ctx, func() error {
		_, err := sdk.CustomHostnames.New(ctx, p)
		return err
	})
	if e, ok := AsAPIError(err); err != nil && !(ok && e.HasCode(codeDuplicateCustomHostname)) {
		return nil, r.classify(err)
	}
	if h, err = r.readHostname(ctx, sdk, hostname); err == nil && h == nil {
		err = fmt.Errorf("wfp-managed backend: the custom hostname %s does not read back after its create", hostname)
	}
	return h, err
}

// deleteHostname deletes hostname's custom hostname and reads it back absent.
func (r wfpRoutes) deleteHostname(ctx context.Context, sdk *Services, hostname string) error {
	h, err := r.readHostname(ctx, sdk, hostname)
	if err != nil || h == nil {
		return err
	}
	var p custom_hostnames.CustomHostnameDeleteParams
	p.ZoneID.Value, p.ZoneID.Present = r.inst.SaaSZoneID, true
	if err := r.call(ctx, func() error {
		_, err := sdk.CustomHostnames.Delete(ctx, h.ID, p)
		return err
	}); err != nil {
		// Deleted meanwhile (a lost answer's retry) reads back absent below.
		if e, ok := AsAPIError(err); !ok || e.Status != http.StatusNotFound {
			return r.classify(err)
		}
	}
	if h, err = r.readHostname(ctx, sdk, hostname); err != nil {
		return err
	}
	if h != nil {
		return errors.New("wfp-managed backend: the custom hostname " + hostname + " still reads back after its delete")
	}
	return nil
}
