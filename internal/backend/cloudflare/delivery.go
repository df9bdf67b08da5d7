package cloudflare

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// The Cloudflare packs' runtime inputs (SPEC 8 "Mutations", the one-shot lease): a delivery is one
// script upload that carries exactly its secrets as secret_text bindings plus TAKOFORM_DELIVERY,
// so it lands whole or not at all, and it settles on the value-free readback of one version's
// bindings, since Cloudflare never shows a secret.

var _ backend.ValueFreeSink = (*cloudflareScripts)(nil)
var _ backend.DeliveryBudget = (*cloudflareScripts)(nil)

// resends bounds how often a delivery whose answer was lost is sent again, each time only after a
// readback showed it did not land.
const resends = 2

// DeliverSecrets uploads the script's current version again (its code read back from Cloudflare,
// its non-secret bindings as they are) with the delivery's secrets and TAKOFORM_DELIVERY, and
// nothing else of any earlier delivery. The code is read back rather than kept by the Host: the
// upload then cannot change what the worker runs, whichever replica deployed it, and it never
// needs the bundle on the lease's value-bearing seam.
//
// After an answer that may have been lost it reads the bindings back before it sends again, and
// only this call, which holds the values, ever sends them again (SPEC 8). Extra secrets are
// deleted before it returns.
func (c *cloudflareScripts) DeliverSecrets(ctx context.Context, d backend.Delivery, values map[string]vocab.Secret) error {
	sdk, err := c.api(ctx)
	if err != nil {
		return err
	}
	want := slices.Sorted(maps.Keys(values))
	for attempt := 0; ; attempt++ {
		now, err := c.read(ctx, sdk, d.ScriptName)
		if err != nil {
			return err
		}
		if now == nil {
			return fmt.Errorf("%s backend: script %s is not on installation %s; its delivery cannot land", c.inst.Pack, d.ScriptName, c.inst.Name)
		}
		if now.workerUID != d.WorkerUID.String() {
			return fmt.Errorf("%w: script %s on installation %s", backend.ErrScriptHeld, d.ScriptName, c.inst.Name)
		}
		if now.delivery == d.PreparationID && slices.Equal(now.secretNames, want) {
			break // it landed (an earlier try whose answer was lost)
		}
		if attempt > resends {
			return fmt.Errorf("%w: installation %s: the delivery's upload did not land after %d tries", backend.ErrUnreachable, c.inst.Name, attempt)
		}
		u, err := c.deliveryUpload(ctx, sdk, d, now, values)
		if err != nil {
			return err
		}
		err = c.call(ctx, func() error { return c.place.Upload(ctx, sdk, d.ScriptName, u) })
		if err == nil {
			break
		}
		if !ambiguous(err) {
			return c.classify(err)
		}
		// The answer was lost (or Cloudflare failed inside): only the readback at the top of the
		// loop may say whether it landed.
	}
	return c.prune(ctx, sdk, d.ScriptName, want)
}

// ambiguous reports an upload whose outcome is unknown: no answer, or Cloudflare's own failure.
func ambiguous(err error) bool {
	var limited *backend.RateLimitedError
	if errors.As(err, &limited) || errors.Is(err, context.Canceled) {
		return false
	}
	e, ok := AsAPIError(err)
	return !ok || e.Status >= http.StatusInternalServerError
}

// deliveryUpload is the dispatch upload over the version now holds: the same modules, main module,
// compatibility settings and limits, every plain-text binding as it reads back, every other non-secret
// binding inherited, TAKOFORM_DELIVERY naming this delivery, and exactly its secrets.
func (c *cloudflareScripts) deliveryUpload(ctx context.Context, sdk *Services, d backend.Delivery, now *held, values map[string]vocab.Secret) (Upload, error) {
	var modules []Module
	var main string
	err := c.call(ctx, func() (err error) { modules, main, err = c.place.Content(ctx, sdk, d.ScriptName); return err })
	if err != nil {
		return Upload{}, c.classify(err)
	}
	u := Upload{
		MainModule: main, CompatibilityDate: now.settings.CompatibilityDate, CompatibilityFlags: now.settings.CompatibilityFlags,
		Modules: modules, PlainText: map[string]string{}, Secrets: values, StrictInherit: true,
		CPUMs: now.settings.CPUMs,
	}
	for _, b := range now.settings.Bindings {
		switch b.Type {
		case "plain_text":
			u.PlainText[b.Name] = b.Text
		case "secret_text":
			// An earlier delivery's: replaced whole by this one.
		default:
			u.Inherit = append(u.Inherit, b.Name)
		}
	}
	u.PlainText[BindingWorkerUID] = d.WorkerUID.String()
	u.PlainText[BindingDelivery] = d.PreparationID
	return u, nil
}

// ReadbackSecrets reads the script's current version back and answers the value-free digest of
// the worker UID, delivery and secret names that one version holds (the challenge is not used:
// Cloudflare cannot answer a keyed digest of values). Cloudflare cannot be told to refuse a
// delivery from then on; the Host never sends one again after a readback that did not match.
func (c *cloudflareScripts) ReadbackSecrets(ctx context.Context, d backend.Delivery, _ []byte) ([]byte, bool, error) {
	sdk, err := c.api(ctx)
	if err != nil {
		return nil, false, err
	}
	now, err := c.read(ctx, sdk, d.ScriptName)
	if err != nil || now == nil {
		return nil, false, err
	}
	return backend.DeliveryDigest(now.workerUID, now.delivery, now.secretNames), true, nil
}

// ExpectedDigest is the value-free digest of d as it should read back.
func (c *cloudflareScripts) ExpectedDigest(d backend.Delivery) []byte {
	return backend.DeliveryDigest(d.WorkerUID.String(), d.PreparationID, d.SecretNames)
}
