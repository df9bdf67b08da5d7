package cloudflare

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"
	"github.com/cloudflare/cloudflare-go/v6/workers"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// The endpoint half of both Cloudflare packs (SPEC 8): an endpoint's route is the script's
// workers.dev subdomain route on workers-dev, and a routing KV entry on wfp-managed. Neither
// readback proves that Cloudflare's edge stopped routing a deleted route, so an absent route reads
// back with Lingers = the installation's propagation window, and the Host counts the route deleted
// (and closes its deletion attestation) only once that window has passed since the readback.

// servicesFunc returns an installation's SDK services (built on first use).
type servicesFunc func(context.Context) (*Services, error)

// callFunc makes one API call within the installation's rate budget (ratelimit.go).
type callFunc func(ctx context.Context, fn func() error) error

// routeMutator is an endpoint half: Mutator for the route kind.
type routeMutator interface {
	Apply(ctx context.Context, d backend.Desired) (backend.Observation, error)
	Delete(ctx context.Context, d backend.Desired) error
	Observe(ctx context.Context, kind, hostname string) (backend.Observation, error)
}

// newWFPRoutes is the endpoint half of a wfp-managed installation. edge reaches Cloudflare's
// edge for the dispatch worker's probe (nil: a plain client).
func newWFPRoutes(inst catalog.Installation, api servicesFunc, call callFunc, classify func(error) error, edge *http.Client) wfpRoutes {
	if edge == nil {
		edge = &http.Client{Timeout: 10 * time.Second}
	}
	// A new entry should reach the edge within the propagation window: wait for it that long
	// (and a little), never more than 15 s.
	wait := min(inst.Propagation()+time.Second, 15*time.Second)
	return wfpRoutes{inst: inst, api: api, call: call, classify: classify, edge: edge, probeWait: wait}
}

// workersDevRoutes mutates endpoints on a workers-dev installation: the workers.dev subdomain
// route of the endpoint's script. The route is two flags on the script, so it carries no
// deployment: its readback says AnyDeployment. Cloudflare's route DELETE is unconditional; a late
// delete of a replaced endpoint cannot reach its successor only because the successor waits for
// this endpoint's deletion to be confirmed and to have propagated (the reservation fences).
type workersDevRoutes struct {
	inst     catalog.Installation
	api      servicesFunc
	call     callFunc
	classify func(error) error
}

// script is the script that serves hostname on this installation, or false for a hostname that
// is not one of its workers.dev names.
func (r workersDevRoutes) script(hostname string) (string, bool) {
	name, ok := strings.CutSuffix(hostname, "."+r.inst.AccountSubdomain+".workers.dev")
	return name, ok && backend.ValidLabel(name)
}

// checkPlacement reads the account's workers.dev subdomain, which must still be the catalog's
// (SPEC 8: checked before each endpoint create).
func (r workersDevRoutes) checkPlacement(ctx context.Context, sdk *Services) error {
	var p workers.SubdomainGetParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	var sub *workers.SubdomainGetResponse
	err := r.call(ctx, func() (err error) { sub, err = sdk.Subdomains.Get(ctx, p); return err })
	if err != nil {
		return r.classify(err)
	}
	if sub.Subdomain != r.inst.AccountSubdomain {
		return fmt.Errorf("%w: installation %s expects workers.dev subdomain %q, but the account's is %q",
			backend.ErrPlacementDrift, r.inst.Name, r.inst.AccountSubdomain, sub.Subdomain)
	}
	return nil
}

func (r workersDevRoutes) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	script, ok := r.script(d.NativeName)
	if !ok || script != d.ScriptName {
		return backend.Observation{}, fmt.Errorf("workers-dev backend: %s is not the workers.dev name of script %s on installation %s", d.NativeName, d.ScriptName, r.inst.Name)
	}
	sdk, err := r.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	if err := r.checkPlacement(ctx, sdk); err != nil {
		return backend.Observation{}, err
	}
	var p workers.ScriptSubdomainNewParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	p.Enabled.Value, p.Enabled.Present = true, true
	p.PreviewsEnabled.Value, p.PreviewsEnabled.Present = false, true
	// Enabling is idempotent: after a lost answer the Host reads the route back, and a retry
	// posts the same flags again.
	if err := r.call(ctx, func() error { _, err := sdk.Scripts.Subdomain.New(ctx, script, p); return err }); err != nil {
		return backend.Observation{}, r.classify(err)
	}
	return r.Observe(ctx, backend.NativeRoute, d.NativeName)
}

func (r workersDevRoutes) Delete(ctx context.Context, d backend.Desired) error {
	script, ok := r.script(d.NativeName)
	if !ok {
		return nil // never a route of this installation
	}
	sdk, err := r.api(ctx)
	if err != nil {
		return err
	}
	var p workers.ScriptSubdomainDeleteParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	if err := r.call(ctx, func() error { _, err := sdk.Scripts.Subdomain.Delete(ctx, script, p); return err }); err != nil {
		if e, ok := AsAPIError(err); !ok || !e.IsNotFound() {
			return r.classify(err)
		}
	}
	obs, err := r.Observe(ctx, backend.NativeRoute, d.NativeName)
	if err != nil {
		return err
	}
	if obs.Present {
		return fmt.Errorf("workers-dev backend: the workers.dev route of %s still reads back enabled after its delete", script)
	}
	return nil
}

// Observe reads the route back: present while either flag is set; absent when both are false or
// the script is gone (10007). Ready is SPEC 8's single control-plane witness, weaker than
// selfhost's two: the script exists (its upload was confirmed by its own readback) and its route
// reads back enabled. Nothing here proves the edge serves it.
func (r workersDevRoutes) Observe(ctx context.Context, _ string, hostname string) (backend.Observation, error) {
	script, ok := r.script(hostname)
	if !ok {
		return backend.Observation{Lingers: r.inst.Propagation()}, nil
	}
	sdk, err := r.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	var p workers.ScriptSubdomainGetParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	var got *workers.ScriptSubdomainGetResponse
	err = r.call(ctx, func() (err error) { got, err = sdk.Scripts.Subdomain.Get(ctx, script, p); return err })
	if e, ok := AsAPIError(err); ok && e.IsNotFound() {
		return backend.Observation{Lingers: r.inst.Propagation()}, nil
	}
	if err != nil {
		return backend.Observation{}, r.classify(err)
	}
	if !got.Enabled && !got.PreviewsEnabled {
		return backend.Observation{Lingers: r.inst.Propagation()}, nil
	}
	obs := backend.Observation{Present: true, AnyDeployment: true, Admitted: true}
	switch {
	case !got.Enabled:
		obs.Reason, obs.Message = "RoutePending", "only the script's preview URLs are enabled on workers.dev"
	case got.PreviewsEnabled:
		obs.Reason, obs.Message = "RoutePending", "the script's preview URLs are enabled on workers.dev too"
	default:
		obs.Ready = true
	}
	return obs, nil
}

// wfpRoutes mutates endpoints on a wfp-managed installation: the routing KV entry hostname ->
// {scriptName, endpointUid, deploymentId} that the installation's dispatch worker reads. KV has no
// conditional write or delete, so every change is read, compare, write, read back.
type wfpRoutes struct {
	inst     catalog.Installation
	api      servicesFunc
	call     callFunc
	classify func(error) error
	// edge reaches Cloudflare's edge for the dispatch worker's probe.
	edge *http.Client
	// probeWait bounds how long an apply waits for the dispatch worker to see a new entry.
	probeWait time.Duration
}

// routeEntry is the routing KV value: the dispatch worker's RouteEntry and the Host deployment
// that wrote it (which the dispatch worker ignores).
type routeEntry struct {
	dispatch.RouteEntry
	DeploymentID string `json:"deploymentId,omitempty"`
}

// codeKVKeyNotFound is Workers KV's "key not found".
const codeKVKeyNotFound = 10009

// read reads hostname's entry back; nil when KV answers key not found.
func (r wfpRoutes) read(ctx context.Context, sdk *Services, hostname string) (*routeEntry, error) {
	raw, err := r.getRaw(ctx, sdk, hostname)
	if err != nil || raw == nil {
		return nil, err
	}
	var e routeEntry
	if json.Unmarshal(raw, &e) != nil {
		return &routeEntry{}, nil // present, but not an entry the Host wrote
	}
	return &e, nil
}

func (r wfpRoutes) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	custom := r.isCustom(d.NativeName)
	if (custom && r.inst.SaaSZoneID == "") || d.ScriptName == "" {
		return backend.Observation{}, fmt.Errorf("wfp-managed backend: %s is not a hostname under %s of installation %s, which serves no custom domains", d.NativeName, r.inst.BaseDomain, r.inst.Name)
	}
	sdk, err := r.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	now, err := r.read(ctx, sdk, d.NativeName)
	if err != nil {
		return backend.Observation{}, err
	}
	// One endpoint routes one hostname: an entry of another endpoint is never overwritten.
	if now != nil && now.EndpointUID != d.ResourceUID.String() {
		return backend.Observation{}, fmt.Errorf("%w: the routing entry of %s on installation %s names another endpoint", backend.ErrScriptHeld, d.NativeName, r.inst.Name)
	}
	// A custom domain is served through its Cloudflare for SaaS custom hostname (SPEC 3.7).
	var ch *customHostname
	if custom {
		if ch, err = r.ensureHostname(ctx, sdk, d.NativeName); err != nil {
			return backend.Observation{}, err
		}
	}
	// The entry carries the worker's cpuMs, which the dispatch worker dispatches with (SPEC 8).
	value, err := json.Marshal(routeEntry{RouteEntry: dispatch.RouteEntry{ScriptName: d.ScriptName, EndpointUID: d.ResourceUID.String(), CPUMs: d.CPUMs}, DeploymentID: d.DeploymentID.String()})
	if err != nil {
		return backend.Observation{}, err
	}
	var p kv.NamespaceValueUpdateParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	p.Value.Value, p.Value.Present = shared.UnionString(value), true
	// A put of the same value is idempotent: after a lost answer the Host reads the entry back.
	if err := r.call(ctx, func() error {
		_, err := sdk.KVValues.Update(ctx, r.inst.RoutingKVNamespaceID, d.NativeName, p)
		return err
	}); err != nil {
		return backend.Observation{}, r.classify(err)
	}
	// The entry is read back once; then the edge sees it late (KV caches lookups, negative ones
	// too): wait a little for the dispatch worker to answer the probe, which alone is repeated
	// (no KV read, no budget token), then let readiness say the rest.
	e, err := r.read(ctx, sdk, d.NativeName)
	if err != nil {
		return backend.Observation{}, err
	}
	obs := r.observed(ctx, e, ch, d.NativeName)
	if !obs.Holds(d.DeploymentID) || obs.Ready || (custom && !ch.active()) {
		// A custom hostname still validating is Cloudflare's to finish: readiness asks again.
		return obs, nil
	}
	deadline := time.Now().Add(r.probeWait)
	for pause := 100 * time.Millisecond; !time.Now().Add(pause).After(deadline); pause = min(2*pause, time.Second) {
		select {
		case <-ctx.Done():
			return obs, nil
		case <-time.After(pause):
		}
		if r.probe(ctx, d.NativeName) == e.EndpointUID {
			obs.Ready, obs.Reason, obs.Message = true, "", ""
			return obs, nil
		}
	}
	return obs, nil
}

func (r wfpRoutes) Delete(ctx context.Context, d backend.Desired) error {
	sdk, err := r.api(ctx)
	if err != nil {
		return err
	}
	now, err := r.read(ctx, sdk, d.NativeName)
	if err != nil {
		return err
	}
	if now == nil {
		// The entry is gone (perhaps by an earlier attempt): a custom domain's hostname goes too.
		if r.isCustom(d.NativeName) && r.inst.SaaSZoneID != "" {
			return r.deleteHostname(ctx, sdk, d.NativeName)
		}
		return nil
	}
	// KV has no conditional delete (SPEC 8): read, compare, delete, read again. An entry of
	// another endpoint is its successor's and stays, with its custom hostname.
	if now.EndpointUID != d.ResourceUID.String() {
		return nil
	}
	var p kv.NamespaceValueDeleteParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	if err := r.call(ctx, func() error {
		_, err := sdk.KVValues.Delete(ctx, r.inst.RoutingKVNamespaceID, d.NativeName, p)
		return err
	}); err != nil {
		return r.classify(err)
	}
	if now, err = r.read(ctx, sdk, d.NativeName); err != nil {
		return err
	}
	if now != nil && now.EndpointUID == d.ResourceUID.String() {
		return fmt.Errorf("wfp-managed backend: the routing entry of %s still reads back after its delete", d.NativeName)
	}
	if now == nil && r.isCustom(d.NativeName) && r.inst.SaaSZoneID != "" {
		return r.deleteHostname(ctx, sdk, d.NativeName)
	}
	return nil
}

// Observe reads the routing entry back; Ready also needs the dispatch worker to answer the probe
// for the hostname with this entry's endpoint (it looks the route up and dispatches nothing, so no
// user code runs). The Host never claims Ready from the KV write alone.
func (r wfpRoutes) Observe(ctx context.Context, _ string, hostname string) (backend.Observation, error) {
	sdk, err := r.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	e, err := r.read(ctx, sdk, hostname)
	if err != nil {
		return backend.Observation{}, err
	}
	var ch *customHostname
	if e != nil && r.isCustom(hostname) && r.inst.SaaSZoneID != "" {
		if ch, err = r.readHostname(ctx, sdk, hostname); err != nil {
			return backend.Observation{}, err
		}
	}
	return r.observed(ctx, e, ch, hostname), nil
}

// observed is the observation of hostname's entry e as read back (nil: absent), its Ready from
// one probe; a custom domain's also needs its custom hostname ch active, certificate included.
func (r wfpRoutes) observed(ctx context.Context, e *routeEntry, ch *customHostname, hostname string) backend.Observation {
	if e == nil {
		return backend.Observation{Lingers: r.inst.Propagation()}
	}
	obs := backend.Observation{Present: true, Admitted: true}
	obs.DeploymentID, _ = uuid.Parse(e.DeploymentID)
	switch {
	case r.isCustom(hostname) && ch == nil:
		obs.Reason, obs.Message = "CustomHostnamePending", "the routing entry is written; the custom domain's Cloudflare for SaaS custom hostname does not read back"
	case r.isCustom(hostname) && !ch.active():
		obs.Reason, obs.Message = "CustomHostnamePending", fmt.Sprintf("the custom hostname's status is %q and its certificate's %q: Cloudflare activates it once the name points at %s", ch.Status, ch.SSLStatus, r.inst.SaaSCnameTarget)
	case e.EndpointUID != "" && r.probe(ctx, hostname) == e.EndpointUID:
		obs.Ready = true
	default:
		obs.Reason, obs.Message = "RoutePropagating", "the routing entry is written; the dispatch worker does not answer for the hostname yet"
	}
	return obs
}

// probe asks the dispatch worker which endpoint it routes hostname to ("" when it does not
// answer, or routes none).
func (r wfpRoutes) probe(ctx context.Context, hostname string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+hostname+"/", nil)
	if err != nil {
		return ""
	}
	req.Header.Set(dispatch.ProbeHeader, "1")
	res, err := r.edge.Do(req)
	if err != nil {
		return ""
	}
	defer res.Body.Close()
	var got struct {
		Hostname    string `json:"hostname"`
		EndpointUID string `json:"endpointUid"`
	}
	if res.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(res.Body, 4<<10)).Decode(&got) != nil || got.Hostname != hostname {
		return ""
	}
	return got.EndpointUID
}
