package cloudflare

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/shared"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
)

// On wfp-managed a worker's limits.cpuMs is applied by the dispatch worker, not by the script
// (SPEC 8): it dispatches a hostname, and a service binding call, with the cpuMs of the worker's
// script entry (dispatch.ScriptEntry). A routing entry carries the worker's cpuMs as it was at the
// endpoint's create, read only for a worker without a script entry; the Host never rewrites one,
// so a limit change cannot race an endpoint delete's read, compare and delete of its entry (KV
// has no conditional write) and write a deleted route back. So a worker's deployment is not done
// until its script entry reads back with its limit; the Host converges it after every apply of the
// worker (ConvergeLimits), which a re-run repeats until it does.

// ConvergeLimits writes the worker's script entry: read, compared, written, read back.
func (c *cloudflareScripts) ConvergeLimits(ctx context.Context, w backend.WorkerLimits) error {
	r, ok := c.routes.(wfpRoutes)
	if !ok {
		return nil
	}
	sdk, err := c.api(ctx)
	if err != nil {
		return err
	}
	return r.convergeScriptEntry(ctx, sdk, w)
}

// getRaw reads key's value; nil when KV answers key not found.
func (r wfpRoutes) getRaw(ctx context.Context, sdk *Services, key string) ([]byte, error) {
	var p kv.NamespaceValueGetParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	var res *http.Response
	err := r.call(ctx, func() (err error) { res, err = sdk.KVValues.Get(ctx, r.inst.RoutingKVNamespaceID, key, p); return err })
	if e, ok := AsAPIError(err); ok && e.Status == http.StatusNotFound && e.HasCode(codeKVKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, r.classify(err)
	}
	defer res.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("%w: installation %s: the routing value %s could not be read", backend.ErrUnreachable, r.inst.Name, key)
	}
	return raw, nil
}

func (r wfpRoutes) put(ctx context.Context, sdk *Services, key string, value []byte) error {
	var p kv.NamespaceValueUpdateParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	p.Value.Value, p.Value.Present = shared.UnionString(value), true
	// A put of the same value is idempotent: after a lost answer the Host reads it back.
	if err := r.call(ctx, func() error { _, err := sdk.KVValues.Update(ctx, r.inst.RoutingKVNamespaceID, key, p); return err }); err != nil {
		return r.classify(err)
	}
	return nil
}

// convergeScriptEntry makes the script entry read {workerUid, cpuMs}. An entry of another worker
// UID is overwritten only because the script name is this worker's now: the Host writes it after
// the script upload, which refuses a script held by another UID (SPEC 3.4).
func (r wfpRoutes) convergeScriptEntry(ctx context.Context, sdk *Services, w backend.WorkerLimits) error {
	key := dispatch.ScriptKey(w.ScriptName)
	want := dispatch.ScriptEntry{WorkerUID: w.WorkerUID, CPUMs: w.CPUMs}
	read := func() (*dispatch.ScriptEntry, error) {
		raw, err := r.getRaw(ctx, sdk, key)
		if err != nil || raw == nil {
			return nil, err
		}
		var e dispatch.ScriptEntry
		if json.Unmarshal(raw, &e) != nil {
			return &dispatch.ScriptEntry{}, nil
		}
		return &e, nil
	}
	now, err := read()
	if err != nil {
		return err
	}
	if now != nil && *now == want {
		return nil
	}
	value, err := json.Marshal(want)
	if err != nil {
		return err
	}
	if err := r.put(ctx, sdk, key, value); err != nil {
		return err
	}
	if now, err = read(); err != nil {
		return err
	}
	if now == nil || *now != want {
		return fmt.Errorf("wfp-managed backend: the script entry of %s does not read back as written on installation %s", w.ScriptName, r.inst.Name)
	}
	return nil
}

// deleteScriptEntry removes the script entry of a deleted script while it names workerUID.
func (r wfpRoutes) deleteScriptEntry(ctx context.Context, sdk *Services, scriptName, workerUID string) error {
	key := dispatch.ScriptKey(scriptName)
	raw, err := r.getRaw(ctx, sdk, key)
	if err != nil || raw == nil {
		return err
	}
	var e dispatch.ScriptEntry
	if json.Unmarshal(raw, &e) == nil && e.WorkerUID != workerUID {
		return nil // the name's next worker's
	}
	var p kv.NamespaceValueDeleteParams
	p.AccountID.Value, p.AccountID.Present = r.inst.AccountID, true
	if err := r.call(ctx, func() error { _, err := sdk.KVValues.Delete(ctx, r.inst.RoutingKVNamespaceID, key, p); return err }); err != nil {
		return r.classify(err)
	}
	return nil
}

// checkDispatchContract refuses to upload a caller's binding to the dispatch worker's Binding
// entrypoint unless the installed dispatch worker implements it (contract 2 or later): an older
// one would take the upload and fail every call.
func (c *cloudflareScripts) checkDispatchContract(ctx context.Context, sdk *Services) error {
	account := Account{ID: c.inst.AccountID}
	var settings Settings
	err := c.call(ctx, func() (err error) { settings, err = account.Settings(ctx, sdk, c.inst.DispatchWorkerName); return err })
	if e, ok := AsAPIError(err); ok && e.IsNotFound() {
		return fmt.Errorf("%w: installation %s has no dispatch worker %s: run takoserver cloudflare install-dispatch", backend.ErrMisconfigured, c.inst.Name, c.inst.DispatchWorkerName)
	}
	if err != nil {
		return c.classify(err)
	}
	for _, b := range settings.Bindings {
		if b.Type == "plain_text" && b.Name == dispatch.ContractBinding {
			if n, err := strconv.Atoi(b.Text); err == nil && n >= dispatch.Contract {
				return nil
			}
		}
	}
	return fmt.Errorf("%w: the dispatch worker %s of installation %s predates service bindings (contract %d): run takoserver cloudflare install-dispatch",
		backend.ErrMisconfigured, c.inst.DispatchWorkerName, c.inst.Name, dispatch.Contract)
}
