package backend

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/google/uuid"

	"github.com/cloudflare/cloudflare-go/v6/workers"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
	"github.com/takoform/terraform-provider-takoform/internal/safedir"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
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

// workersDevAccount is the workers-dev backend's mutator: one Cloudflare account's Workers scripts, driven
// through Cloudflare's Go SDK (SPEC 8). Each mutation reads the script back first and after.
type workersDevAccount struct {
	inst catalog.Installation

	mu       sync.Mutex
	services *cloudflare.Services
}

func newWorkersDevAccount(inst catalog.Installation) *workersDevAccount {
	return &workersDevAccount{inst: inst}
}

// Supports reports the native kinds this pack mutates: workers only so far (its endpoints, the
// workers.dev subdomain route, answer not_implemented).
func (c *workersDevAccount) Supports(kind string) bool { return kind == NativeWorker }

// api builds the SDK services on first use, reading the token file (a regular 0600 file in a
// private directory) and checking the account's workers.dev subdomain against the catalog.
func (c *workersDevAccount) api(ctx context.Context) (*cloudflare.Services, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.services != nil {
		return c.services, nil
	}
	if !c.inst.HasCloudflareAPI() {
		return nil, fmt.Errorf("%w: installation %s names no accountId and apiTokenFile, so it derives names only", ErrMisconfigured, c.inst.Name)
	}
	raw, err := safedir.ReadFile(filepath.Dir(c.inst.APITokenFile), filepath.Base(c.inst.APITokenFile), safedir.Current())
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: apiTokenFile: %v", ErrMisconfigured, c.inst.Name, err)
	}
	sdk, err := cloudflare.New(cloudflare.Options{BaseURL: c.inst.APIBaseURL, Token: sealing.NewSecret(strings.TrimSpace(string(raw)))})
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: %v", ErrMisconfigured, c.inst.Name, err)
	}
	var p workers.SubdomainGetParams
	p.AccountID.Value, p.AccountID.Present = c.inst.AccountID, true
	sub, err := sdk.Subdomains.Get(ctx, p)
	if err != nil {
		return nil, c.classify(err)
	}
	if sub.Subdomain != c.inst.AccountSubdomain {
		return nil, fmt.Errorf("%w: installation %s expects workers.dev subdomain %q, but the account's is %q",
			ErrPlacementDrift, c.inst.Name, c.inst.AccountSubdomain, sub.Subdomain)
	}
	c.services = sdk
	return sdk, nil
}

// classify turns an SDK error into the backend's errors (SPEC 8 "Errors"). What it returns names
// the installation and Cloudflare's codes, never the token (the SDK error's request is not read).
func (c *workersDevAccount) classify(err error) error {
	e, ok := cloudflare.AsAPIError(err)
	if !ok {
		if errors.Is(err, context.Canceled) {
			return err
		}
		// No answer (a lost one included): only a readback can say what Cloudflare holds.
		return fmt.Errorf("%w: installation %s: Cloudflare's API did not answer", ErrUnreachable, c.inst.Name)
	}
	switch {
	case e.IsAuth():
		return fmt.Errorf("%w: Cloudflare refused the API token of installation %s (codes %v): check its permissions and apiTokenFile",
			ErrMisconfigured, c.inst.Name, codes(e))
	case e.IsRefusedScript():
		return &RefusedError{Message: e.Message()}
	case e.IsRateLimited():
		return fmt.Errorf("%w: installation %s is rate-limited by Cloudflare (retry after %s)", ErrUnreachable, c.inst.Name, e.RetryAfter)
	}
	return fmt.Errorf("installation %s: %w", c.inst.Name, e)
}

func codes(e *cloudflare.APIError) []int {
	out := make([]int, 0, len(e.Errors))
	for _, x := range e.Errors {
		out = append(out, x.Code)
	}
	return out
}

// held is what a script's settings readback shows of it: its Host-reserved bindings and the
// names (never values) of its secrets.
type held struct {
	workerUID   string
	deployment  string
	delivery    string
	secretNames []string
}

// read reads the script's current version's settings back; nil means Cloudflare answered 10007.
func (c *workersDevAccount) read(ctx context.Context, sdk *cloudflare.Services, name string) (*held, error) {
	var p workers.ScriptScriptAndVersionSettingGetParams
	p.AccountID.Value, p.AccountID.Present = c.inst.AccountID, true
	settings, err := sdk.Scripts.ScriptAndVersionSettings.Get(ctx, name, p)
	if e, ok := cloudflare.AsAPIError(err); ok && e.IsNotFound() {
		return nil, nil
	}
	if err != nil {
		return nil, c.classify(err)
	}
	h := &held{}
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
	return h, nil
}

// moduleContentType is the multipart content type of a bundle module, as the runtime node reads
// module kinds: JSON and text by extension, every other module an ES module.
func moduleContentType(name string) string {
	switch {
	case strings.HasSuffix(name, ".json"):
		return "application/json"
	case strings.HasSuffix(name, ".txt"):
		return "text/plain"
	}
	return cloudflare.ModuleContentType
}

// upload is the script upload of d over what the script holds now (SPEC 8 "Mutations"): the
// bundle, the Host-reserved bindings, and each delivered secret the worker still requires listed
// as inherit (so it stays without being resent; a secret it no longer requires is left out and so
// removed). Inherit is strict: a secret deleted meanwhile fails the upload instead of vanishing.
func upload(d Desired, now *held) cloudflare.Upload {
	u := cloudflare.Upload{
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
		u.Modules = append(u.Modules, cloudflare.Module{Name: name, ContentType: moduleContentType(name), Content: []byte(d.Bundle.Modules[name])})
	}
	if now != nil {
		for _, name := range now.secretNames {
			for _, want := range d.SecretNames {
				if name == want {
					u.Inherit = append(u.Inherit, name)
				}
			}
		}
		if len(u.Inherit) > 0 && now.delivery != "" {
			u.PlainText[BindingDelivery] = now.delivery // the secrets kept are that delivery's
		}
	}
	return u
}

func (c *workersDevAccount) Apply(ctx context.Context, d Desired) (Observation, error) {
	if d.Kind != NativeWorker {
		return Observation{}, fmt.Errorf("%w (workers-dev %s)", ErrNotImplemented, d.Kind)
	}
	if d.Bundle == nil {
		return Observation{}, errors.New("workers-dev backend: a worker deployment needs its bundle")
	}
	sdk, err := c.api(ctx)
	if err != nil {
		return Observation{}, err
	}
	now, err := c.read(ctx, sdk, d.NativeName)
	if err != nil {
		return Observation{}, err
	}
	// Cloudflare's PUT overwrites whatever holds the name: only the same worker UID may write it
	// (SPEC 3.4).
	if now != nil && now.workerUID != d.ResourceUID.String() {
		return Observation{}, fmt.Errorf("%w: script %s on installation %s", ErrScriptHeld, d.NativeName, c.inst.Name)
	}
	if _, err := sdk.Scripts.Update(ctx, d.NativeName, upload(d, now).ScriptParams(c.inst.AccountID)); err != nil {
		return Observation{}, c.classify(err)
	}
	return c.Observe(ctx, NativeWorker, d.NativeName)
}

func (c *workersDevAccount) Delete(ctx context.Context, d Desired) error {
	if d.Kind != NativeWorker {
		return fmt.Errorf("%w (workers-dev %s)", ErrNotImplemented, d.Kind)
	}
	sdk, err := c.api(ctx)
	if err != nil {
		return err
	}
	now, err := c.read(ctx, sdk, d.NativeName)
	if err != nil || now == nil {
		return err
	}
	// Cloudflare's DELETE is unconditional: a late delete from a replaced worker must not remove
	// its successor, which holds the name under another UID (SPEC 3.4).
	if now.workerUID != d.ResourceUID.String() {
		return nil
	}
	var p workers.ScriptDeleteParams
	p.AccountID.Value, p.AccountID.Present = c.inst.AccountID, true // never force
	if _, err := sdk.Scripts.Delete(ctx, d.NativeName, p); err != nil {
		if e, ok := cloudflare.AsAPIError(err); !ok || !e.IsNotFound() {
			return c.classify(err)
		}
	}
	// Gone only when a read answers Cloudflare's not-found (10007).
	if now, err = c.read(ctx, sdk, d.NativeName); err != nil {
		return err
	}
	if now != nil {
		return fmt.Errorf("workers-dev backend: script %s still reads back after its delete", d.NativeName)
	}
	return nil
}

func (c *workersDevAccount) Observe(ctx context.Context, kind, nativeName string) (Observation, error) {
	if kind != NativeWorker {
		return Observation{}, fmt.Errorf("%w (workers-dev %s)", ErrNotImplemented, kind)
	}
	sdk, err := c.api(ctx)
	if err != nil {
		return Observation{}, err
	}
	now, err := c.read(ctx, sdk, nativeName)
	if err != nil || now == nil {
		return Observation{}, err
	}
	// A version Cloudflare accepted serves: it refuses a script that does not start. This is the
	// single control-plane witness of SPEC 8 (weaker than selfhost's two).
	obs := Observation{Present: true, Admitted: true, Ready: true}
	obs.DeploymentID, _ = uuid.Parse(now.deployment)
	return obs, nil
}
