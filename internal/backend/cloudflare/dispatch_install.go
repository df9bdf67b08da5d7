package cloudflare

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/takoform/terraform-provider-takoform/internal/backend/cloudflare/dispatch"
	"github.com/takoform/terraform-provider-takoform/internal/catalog"
)

// BindingDispatchSource names the digest of the dispatch worker's source on its script, so that
// an install can tell an up-to-date dispatch worker without downloading its code.
const BindingDispatchSource = "TAKOFORM_DISPATCH_SOURCE"

// DispatchInstall is what InstallDispatch found and did.
type DispatchInstall struct {
	Installation string
	AccountID    string
	Script       string
	// Action is "created", "updated" or "unchanged".
	Action            string
	DispatchNamespace string
	RoutingKV         string
	CacheTTLSeconds   int
}

// dispatchSourceDigest is the digest the dispatch worker's script carries.
func dispatchSourceDigest() string {
	sum := sha256.Sum256(dispatch.Source)
	return hex.EncodeToString(sum[:16])
}

// InstallDispatch uploads the product's dispatch worker (package dispatch) to a wfp-managed
// installation's account as its dispatchWorkerName, bound to the routing KV namespace (ROUTES)
// and the dispatch namespace (DISPATCHER), or leaves it when it already runs this source with
// these bindings (SPEC 8; `takoserver cloudflare install-dispatch`). It never overwrites a tenant's
// script, and what it returns or fails with names the installation, never the token.
func InstallDispatch(ctx context.Context, inst catalog.Installation) (DispatchInstall, error) {
	out := DispatchInstall{Installation: inst.Name, AccountID: inst.AccountID, Script: inst.DispatchWorkerName,
		DispatchNamespace: inst.DispatchNamespace, RoutingKV: inst.RoutingKVNamespaceID, CacheTTLSeconds: dispatch.MinCacheTTL}
	if inst.Pack != catalog.PackWFPManaged {
		return out, fmt.Errorf("installation %s is a %s installation: only wfp-managed ones have a dispatch worker", inst.Name, inst.Pack)
	}
	if inst.DispatchWorkerName == "" || inst.DispatchNamespace == "" || inst.RoutingKVNamespaceID == "" {
		return out, fmt.Errorf("installation %s needs dispatchWorkerName, dispatchNamespace and routingKvNamespaceId", inst.Name)
	}
	// The dispatch worker caches routing lookups for cacheTtl, which the Host's propagation wait
	// must cover, or a deleted route could be served after the Host counts it gone.
	if inst.Propagation().Seconds() < float64(out.CacheTTLSeconds) {
		return out, fmt.Errorf("installation %s: routePropagationSeconds (%.0f) is shorter than the dispatch worker's routing cache (%d s); raise it",
			inst.Name, inst.Propagation().Seconds(), out.CacheTTLSeconds)
	}
	// The pack's own services: built from the token file, and the dispatch namespace checked.
	c := newCloudflareScripts(inst, nil, nil)
	sdk, err := c.api(ctx)
	if err != nil {
		return out, err
	}
	classify := c.classify
	digest := dispatchSourceDigest()
	cacheTTL := strconv.Itoa(out.CacheTTLSeconds)

	now, err := readDispatch(ctx, sdk, inst, classify)
	if err != nil {
		return out, err
	}
	switch {
	case now == nil:
		out.Action = "created"
	case now.workerUID:
		return out, fmt.Errorf("installation %s: account script %s is a tenant's worker; choose another dispatchWorkerName", inst.Name, inst.DispatchWorkerName)
	case now.is(inst, cacheTTL, digest):
		out.Action = "unchanged"
		return out, nil
	default:
		out.Action = "updated"
	}

	u := DispatchUpload(inst, out.CacheTTLSeconds)
	// The upload is the same whole script every time, so a retry after a lost answer is harmless;
	// the readback below says what Cloudflare holds either way.
	upErr := Account{ID: inst.AccountID}.Upload(ctx, sdk, inst.DispatchWorkerName, u)
	now, err = readDispatch(ctx, sdk, inst, classify)
	if err != nil {
		return out, err
	}
	if now == nil || !now.is(inst, cacheTTL, digest) {
		if upErr != nil {
			return out, classify(upErr)
		}
		return out, fmt.Errorf("installation %s: the dispatch worker %s does not read back as uploaded", inst.Name, inst.DispatchWorkerName)
	}
	return out, nil
}

// DispatchUpload is the upload of the dispatch worker of inst, its routing reads cached for
// cacheTTL seconds.
func DispatchUpload(inst catalog.Installation, cacheTTL int) Upload {
	return Upload{
		MainModule: dispatch.MainModule, CompatibilityDate: dispatch.CompatibilityDate,
		Modules: []Module{{Name: dispatch.MainModule, Content: dispatch.Source}},
		// The contract binding is what a caller's upload reads back before it binds to the
		// Binding entrypoint (an older dispatch worker has none: bindings are refused, not broken).
		PlainText: map[string]string{dispatch.CacheTTLBinding: strconv.Itoa(cacheTTL), BindingDispatchSource: dispatchSourceDigest(),
			dispatch.ContractBinding: strconv.Itoa(dispatch.Contract)},
		KVNamespaces:       map[string]string{dispatch.RoutesBinding: inst.RoutingKVNamespaceID},
		DispatchNamespaces: map[string]string{dispatch.DispatcherBinding: inst.DispatchNamespace},
	}
}

// installedDispatch is what the dispatch worker's script holds, from its settings readback.
type installedDispatch struct {
	routes, dispatcher, cacheTTL, source, contract string
	workerUID                                      bool
}

// is reports whether the script holds what InstallDispatch uploads: the same check decides
// "unchanged" before an upload and whether the upload landed after it.
func (d *installedDispatch) is(inst catalog.Installation, cacheTTL, source string) bool {
	return d.routes == inst.RoutingKVNamespaceID && d.dispatcher == inst.DispatchNamespace && d.cacheTTL == cacheTTL && d.source == source &&
		d.contract == strconv.Itoa(dispatch.Contract)
}

func readDispatch(ctx context.Context, sdk *Services, inst catalog.Installation, classify func(error) error) (*installedDispatch, error) {
	settings, err := Account{ID: inst.AccountID}.Settings(ctx, sdk, inst.DispatchWorkerName)
	if e, ok := AsAPIError(err); ok && e.IsNotFound() {
		return nil, nil
	}
	if err != nil {
		return nil, classify(err)
	}
	out := &installedDispatch{}
	for _, b := range settings.Bindings {
		switch {
		case b.Name == dispatch.RoutesBinding && b.Type == "kv_namespace":
			out.routes = b.NamespaceID
		case b.Name == dispatch.DispatcherBinding && b.Type == "dispatch_namespace":
			out.dispatcher = b.Namespace
		case b.Name == dispatch.CacheTTLBinding && b.Type == "plain_text":
			out.cacheTTL = b.Text
		case b.Name == BindingDispatchSource && b.Type == "plain_text":
			out.source = b.Text
		case b.Name == dispatch.ContractBinding && b.Type == "plain_text":
			out.contract = b.Text
		case b.Name == BindingWorkerUID:
			out.workerUID = true
		}
	}
	return out, nil
}
