package cloudflare

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
)

// The Host-reserved plain-text bindings of a Cloudflare script (SPEC 3.4, 3.5, 8).
const (
	// BindingWorkerUID names the worker UID that holds the script; read back before any upload or
	// delete, so that no write moves a script from one worker to another.
	BindingWorkerUID = "TAKOFORM_WORKER_UID"
	// BindingDeployment names the Host deployment the script's current version is, which the
	// readback reports as Observation.DeploymentID.
	BindingDeployment = "TAKOFORM_DEPLOYMENT"
	// BindingDelivery names the runtime input delivered with the script's secrets.
	BindingDelivery = "TAKOFORM_DELIVERY"
)

// cloudflareScripts is the mutator of both Cloudflare packs (SPEC 8): the Workers scripts of one
// place, an account's own (workers-dev) or one dispatch namespace's (wfp-managed), driven through
// Cloudflare's Go SDK. Each mutation reads the script back first and after. Every API call takes
// from the installation's rate budget (ratelimit.go).
type cloudflareScripts struct {
	inst   catalog.Installation
	place  Place
	budget backend.RateBudget
	// routes is the pack's endpoint half (routes.go): the workers.dev route or the routing KV
	// entry.
	routes routeMutator

	// mu guards services (built once) and building (the build in flight); it is never held across
	// a call to Cloudflare or a rate-budget wait.
	mu       sync.Mutex
	services *Services
	building *apiBuild
}

// NewMutator is the mutator of inst for both Cloudflare packs (a backend.Pack).
func NewMutator(inst catalog.Installation, env backend.PackEnv) backend.Mutator {
	return newCloudflareScripts(inst, env.Budget, env.EdgeClient)
}

func newCloudflareScripts(inst catalog.Installation, budget backend.RateBudget, edge *http.Client) *cloudflareScripts {
	c := &cloudflareScripts{inst: inst, budget: budget}
	if inst.Pack == catalog.PackWFPManaged {
		c.place = Namespace{AccountID: inst.AccountID, Name: inst.DispatchNamespace}
		c.routes = newWFPRoutes(inst, c.api, c.call, c.classify, edge)
	} else {
		c.place = Account{ID: inst.AccountID}
		c.routes = workersDevRoutes{inst: inst, api: c.api, call: c.call, classify: c.classify}
	}
	return c
}

// Supports reports the native kinds this pack mutates: workers and their endpoints' routes.
func (c *cloudflareScripts) Supports(kind string) bool {
	return kind == backend.NativeWorker || kind == backend.NativeRoute
}

// api answers the SDK services, built on first use by connect. The services are kept under c.mu,
// but never built under it: connect calls Cloudflare and may wait on the rate budget, and every
// request of every tenant on the installation asks api first. One caller builds at a time; the
// others wait for its answer or their own context's end, whichever comes first, and one whose
// builder gave up (its context ended) builds again itself.
func (c *cloudflareScripts) api(ctx context.Context) (*Services, error) {
	for {
		c.mu.Lock()
		if c.services != nil {
			sdk := c.services
			c.mu.Unlock()
			return sdk, nil
		}
		if b := c.building; b != nil {
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-b.done:
			}
			if b.err != nil && b.gaveUp {
				continue
			}
			return b.sdk, b.err
		}
		b := &apiBuild{done: make(chan struct{})}
		c.building = b
		c.mu.Unlock()
		c.build(ctx, b)
		return b.sdk, b.err
	}
}

// build runs connect for b and publishes its answer, even if connect panics.
func (c *cloudflareScripts) build(ctx context.Context, b *apiBuild) {
	b.err = errors.New("cloudflare: building the SDK services failed")
	defer func() {
		b.gaveUp = ctx.Err() != nil
		c.mu.Lock()
		if b.err == nil {
			c.services = b.sdk
		}
		c.building = nil
		c.mu.Unlock()
		close(b.done)
	}()
	b.sdk, b.err = c.connect(ctx)
}

// apiBuild is one connect in flight: its answer once done is closed.
type apiBuild struct {
	done   chan struct{}
	sdk    *Services
	err    error
	gaveUp bool
}

// connect builds the SDK services, reading the token file (a regular 0600 file in a private
// directory) and checking that the installation's place is where the catalog says: the account's
// workers.dev subdomain (workers-dev), the dispatch namespace (wfp-managed).
func (c *cloudflareScripts) connect(ctx context.Context) (*Services, error) {
	if !c.inst.HasCloudflareAPI() {
		return nil, fmt.Errorf("%w: installation %s names no accountId and apiTokenFile, so it derives names only", backend.ErrMisconfigured, c.inst.Name)
	}
	raw, err := safedir.ReadFile(filepath.Dir(c.inst.APITokenFile), filepath.Base(c.inst.APITokenFile), safedir.Current())
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: apiTokenFile: %v", backend.ErrMisconfigured, c.inst.Name, err)
	}
	sdk, err := New(Options{BaseURL: c.inst.APIBaseURL, Token: vocab.NewSecret(strings.TrimSpace(string(raw)))})
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: %v", backend.ErrMisconfigured, c.inst.Name, err)
	}
	if c.inst.Pack == catalog.PackWFPManaged {
		var p workers_for_platforms.DispatchNamespaceGetParams
		p.AccountID.Value, p.AccountID.Present = c.inst.AccountID, true
		err := c.call(ctx, func() error { _, err := sdk.DispatchNamespaces.Get(ctx, c.inst.DispatchNamespace, p); return err })
		if e, ok := AsAPIError(err); ok && e.Status == http.StatusNotFound {
			return nil, fmt.Errorf("%w: installation %s: the account has no dispatch namespace %q", backend.ErrPlacementDrift, c.inst.Name, c.inst.DispatchNamespace)
		}
		if err != nil {
			return nil, c.classify(err)
		}
		return sdk, nil
	}
	var p workers.SubdomainGetParams
	p.AccountID.Value, p.AccountID.Present = c.inst.AccountID, true
	var sub *workers.SubdomainGetResponse
	if err := c.call(ctx, func() (err error) { sub, err = sdk.Subdomains.Get(ctx, p); return err }); err != nil {
		return nil, c.classify(err)
	}
	if sub.Subdomain != c.inst.AccountSubdomain {
		return nil, fmt.Errorf("%w: installation %s expects workers.dev subdomain %q, but the account's is %q",
			backend.ErrPlacementDrift, c.inst.Name, c.inst.AccountSubdomain, sub.Subdomain)
	}
	return sdk, nil
}

// classify turns an SDK error into the backend's errors (SPEC 8 "Errors"). What it returns names
// the installation and Cloudflare's codes, never the token (the SDK error's request is not read).
func (c *cloudflareScripts) classify(err error) error {
	var limited *backend.RateLimitedError
	if errors.As(err, &limited) {
		return err
	}
	e, ok := AsAPIError(err)
	if !ok {
		if errors.Is(err, context.Canceled) {
			return err
		}
		// No answer (a lost one included): only a readback can say what Cloudflare holds.
		return fmt.Errorf("%w: installation %s: Cloudflare's API did not answer", backend.ErrUnreachable, c.inst.Name)
	}
	switch {
	case e.IsAuth():
		return fmt.Errorf("%w: Cloudflare refused the API token of installation %s (codes %v): check its permissions and apiTokenFile",
			backend.ErrMisconfigured, c.inst.Name, codes(e))
	case e.IsRefusedScript():
		return &backend.RefusedError{Message: e.Message()}
	case e.IsRateLimited():
		return &backend.RateLimitedError{Installation: c.inst.Name, RetryAfter: e.RetryAfter}
	}
	return fmt.Errorf("installation %s: %w", c.inst.Name, e)
}

func codes(e *APIError) []int {
	out := make([]int, 0, len(e.Errors))
	for _, x := range e.Errors {
		out = append(out, x.Code)
	}
	return out
}

// held is what a script's settings readback shows of its current version: its Host-reserved
// bindings, the names (never values) of its secrets, and what a dispatch upload resends as it is.
type held struct {
	workerUID   string
	deployment  string
	delivery    string
	secretNames []string
	settings    Settings
}

// read reads the script's current version's settings back; nil means Cloudflare answered 10007.
func (c *cloudflareScripts) read(ctx context.Context, sdk *Services, name string) (*held, error) {
	var settings Settings
	err := c.call(ctx, func() (err error) { settings, err = c.place.Settings(ctx, sdk, name); return err })
	if e, ok := AsAPIError(err); ok && e.IsNotFound() {
		return nil, nil
	}
	if err != nil {
		return nil, c.classify(err)
	}
	h := &held{settings: settings}
	for _, b := range settings.Bindings {
		switch {
		case b.Type == "plain_text" && b.Name == BindingWorkerUID:
			h.workerUID = b.Text
		case b.Type == "plain_text" && b.Name == BindingDeployment:
			h.deployment = b.Text
		case b.Type == "plain_text" && b.Name == BindingDelivery:
			h.delivery = b.Text
		case b.Type == "secret_text":
			h.secretNames = append(h.secretNames, b.Name)
		}
	}
	slices.Sort(h.secretNames)
	return h, nil
}

// moduleContentType is the multipart content type of a bundle module, as the runtime node reads
// module kinds (workerconf.ModuleKind): JSON, text, WebAssembly and data by extension, every
// other module an ES module.
func moduleContentType(name string) string {
	switch workerconf.ModuleKind(name) {
	case workerconf.ModuleJSON:
		return "application/json"
	case workerconf.ModuleText:
		return "text/plain"
	case workerconf.ModuleWasm:
		return "application/wasm"
	case workerconf.ModuleData:
		return "application/octet-stream"
	}
	return ModuleContentType
}

// upload is the script upload of d over what the script holds now (SPEC 8 "Mutations"): the
// bundle, the Host-reserved bindings, and each delivered secret the worker still requires listed
// as inherit (so it stays without being resent; a secret it no longer requires is left out and so
// removed). Inherit is strict: a secret deleted meanwhile fails the upload instead of vanishing.
func upload(d backend.Desired, now *held) Upload {
	u := Upload{
		MainModule: d.Bundle.MainModule, CompatibilityDate: d.Bundle.CompatibilityDate,
		PlainText:     map[string]string{BindingWorkerUID: d.ResourceUID.String(), BindingDeployment: d.DeploymentID.String()},
		StrictInherit: true,
	}
	// The worker's own variables and flags (workerconf keeps TAKOFORM_ names for the reserved ones).
	for name, v := range d.Bundle.Settings.Vars {
		u.PlainText[name] = v
	}
	u.JSON, u.CompatibilityFlags = d.Bundle.Settings.JSONVars, d.Bundle.Settings.CompatibilityFlags
	u.Services, u.CPUMs = d.Bundle.ServiceScripts, d.Bundle.Settings.LimitsOrZero().CPUMs
	for _, name := range slices.Sorted(maps.Keys(d.Bundle.Modules)) {
		// The Host checked every bytes module's base64 when it took the worker.
		content, _ := workerconf.ModuleBytes(name, d.Bundle.Modules[name])
		u.Modules = append(u.Modules, Module{Name: name, ContentType: moduleContentType(name), Content: content})
	}
	if now != nil {
		for _, name := range now.secretNames {
			if slices.Contains(d.SecretNames, name) {
				u.Inherit = append(u.Inherit, name)
			}
		}
		if len(u.Inherit) > 0 && now.delivery != "" {
			u.PlainText[BindingDelivery] = now.delivery // the secrets kept are that delivery's
		}
	}
	return u
}

// Apply uploads a worker's script, or makes an endpoint's route.
func (c *cloudflareScripts) Apply(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	switch d.Kind {
	case backend.NativeWorker:
		return c.applyScript(ctx, d)
	case backend.NativeRoute:
		return c.routes.Apply(ctx, d)
	}
	return backend.Observation{}, fmt.Errorf("%w (%s %s)", backend.ErrNotImplemented, c.inst.Pack, d.Kind)
}

// Delete deletes a worker's script or an endpoint's route (compare-and-delete).
func (c *cloudflareScripts) Delete(ctx context.Context, d backend.Desired) error {
	switch d.Kind {
	case backend.NativeWorker:
		return c.deleteScript(ctx, d)
	case backend.NativeRoute:
		return c.routes.Delete(ctx, d)
	}
	return fmt.Errorf("%w (%s %s)", backend.ErrNotImplemented, c.inst.Pack, d.Kind)
}

// Observe reads a worker's script or an endpoint's route back.
func (c *cloudflareScripts) Observe(ctx context.Context, kind, nativeName string) (backend.Observation, error) {
	switch kind {
	case backend.NativeWorker:
		return c.observeScript(ctx, nativeName)
	case backend.NativeRoute:
		return c.routes.Observe(ctx, kind, nativeName)
	}
	return backend.Observation{}, fmt.Errorf("%w (%s %s)", backend.ErrNotImplemented, c.inst.Pack, kind)
}

func (c *cloudflareScripts) applyScript(ctx context.Context, d backend.Desired) (backend.Observation, error) {
	if d.Bundle == nil {
		return backend.Observation{}, fmt.Errorf("%s backend: a worker deployment needs its bundle", c.inst.Pack)
	}
	sdk, err := c.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	now, err := c.read(ctx, sdk, d.NativeName)
	if err != nil {
		return backend.Observation{}, err
	}
	// Cloudflare's PUT overwrites whatever holds the name: only the same worker UID may write it
	// (SPEC 3.4).
	if now != nil && now.workerUID != d.ResourceUID.String() {
		return backend.Observation{}, fmt.Errorf("%w: script %s on installation %s", backend.ErrScriptHeld, d.NativeName, c.inst.Name)
	}
	u := upload(d, now)
	if c.inst.Pack == catalog.PackWFPManaged {
		// The dispatch worker applies the limit (SPEC 8), and a namespace script's service
		// binding cannot resolve a sibling: each is a binding to the dispatch worker's Binding
		// entrypoint, props naming the callee (dispatch.BindingProps).
		u.CPUMs = 0
		if len(u.Services) > 0 {
			if err := c.checkDispatchContract(ctx, sdk); err != nil {
				return backend.Observation{}, err
			}
			u.Entrypoints = map[string]EntrypointBinding{}
			for name, script := range u.Services {
				u.Entrypoints[name] = EntrypointBinding{Service: c.inst.DispatchWorkerName, Entrypoint: dispatch.BindingEntrypoint,
					Props: dispatch.BindingProps{CalleeScript: script, CalleeUID: d.Bundle.Settings.ServiceBindings[name]}}
			}
			u.Services = nil
		}
	}
	if err := c.call(ctx, func() error { return c.place.Upload(ctx, sdk, d.NativeName, u) }); err != nil {
		return backend.Observation{}, c.classify(err)
	}
	// What the worker keeps is at most the secrets it requires (SPEC 8: extras are deleted before
	// the deployment reports active), whatever the upload kept.
	if err := c.prune(ctx, sdk, d.NativeName, d.SecretNames); err != nil {
		return backend.Observation{}, err
	}
	// Cron triggers go through the schedules API (SPEC 3.6), on account scripts only: set when
	// the worker has some, and on every update (one call more), so that removed ones go.
	if acct, ok := c.place.(Account); ok && (len(d.Bundle.Settings.Crons) > 0 || now != nil) {
		if err := c.call(ctx, func() error { return acct.SetSchedules(ctx, sdk, d.NativeName, d.Bundle.Settings.Crons) }); err != nil {
			return backend.Observation{}, c.classify(err)
		}
	}
	return c.observeScript(ctx, d.NativeName)
}

// prune compares the script's secret names with want after an upload and deletes every other
// secret (SPEC 8), then reads back that none is left.
func (c *cloudflareScripts) prune(ctx context.Context, sdk *Services, name string, want []string) error {
	now, err := c.read(ctx, sdk, name)
	if err != nil || now == nil {
		return err
	}
	extra := false
	for _, secret := range now.secretNames {
		if slices.Contains(want, secret) {
			continue
		}
		extra = true
		err := c.call(ctx, func() error { return c.place.DeleteSecret(ctx, sdk, name, secret) })
		if e, ok := AsAPIError(err); ok && e.Status == http.StatusNotFound {
			continue
		}
		if err != nil {
			return c.classify(err)
		}
	}
	if !extra {
		return nil
	}
	if now, err = c.read(ctx, sdk, name); err != nil || now == nil {
		return err
	}
	for _, secret := range now.secretNames {
		if !slices.Contains(want, secret) {
			return fmt.Errorf("%s backend: script %s still holds a secret it was not given after its delete", c.inst.Pack, name)
		}
	}
	return nil
}

func (c *cloudflareScripts) deleteScript(ctx context.Context, d backend.Desired) error {
	sdk, err := c.api(ctx)
	if err != nil {
		return err
	}
	now, err := c.read(ctx, sdk, d.NativeName)
	if err != nil {
		return err
	}
	if now == nil {
		// Gone already (a retry after a lost answer): its script entry may still stand.
		if r, ok := c.routes.(wfpRoutes); ok {
			return r.deleteScriptEntry(ctx, sdk, d.NativeName, d.ResourceUID.String())
		}
		return nil
	}
	// Cloudflare's DELETE is unconditional: a late delete from a replaced worker must not remove
	// its successor, which holds the name under another UID (SPEC 3.4).
	if now.workerUID != d.ResourceUID.String() {
		return nil
	}
	if err := c.call(ctx, func() error { return c.place.Delete(ctx, sdk, d.NativeName) }); err != nil {
		if e, ok := AsAPIError(err); !ok || !e.IsNotFound() {
			return c.classify(err)
		}
	}
	// Gone only when a read answers Cloudflare's not-found (10007).
	if now, err = c.read(ctx, sdk, d.NativeName); err != nil {
		return err
	}
	if now != nil {
		return fmt.Errorf("%s backend: script %s still reads back after its delete", c.inst.Pack, d.NativeName)
	}
	if r, ok := c.routes.(wfpRoutes); ok {
		// Its script entry goes with it (binding calls to it already find no script).
		return r.deleteScriptEntry(ctx, sdk, d.NativeName, d.ResourceUID.String())
	}
	return nil
}

func (c *cloudflareScripts) observeScript(ctx context.Context, nativeName string) (backend.Observation, error) {
	sdk, err := c.api(ctx)
	if err != nil {
		return backend.Observation{}, err
	}
	now, err := c.read(ctx, sdk, nativeName)
	if err != nil || now == nil {
		return backend.Observation{}, err
	}
	// A version Cloudflare accepted serves: it refuses a script that does not start. This is the
	// single control-plane witness of SPEC 8 (weaker than selfhost's two).
	obs := backend.Observation{Present: true, Admitted: true, Ready: true, WorkerUID: now.workerUID}
	obs.DeploymentID, _ = uuid.Parse(now.deployment)
	return obs, nil
}
