package provider

import (
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/diag"

	"github.com/takoform/terraform-provider-takoform/internal/client"
)

// describe words a client error for a diagnostic, with the Host's problem code and detail.
func describe(err error) string {
	var e *client.Error
	if errors.As(err, &e) {
		msg := fmt.Sprintf("%s (code %s, HTTP %d)", e.Detail, e.Code, e.Status)
		if len(e.UnmetFences) > 0 {
			msg += fmt.Sprintf("; unmet fences: %s", strings.Join(e.UnmetFences, ", "))
		}
		if e.RequestID != "" {
			msg += fmt.Sprintf("; request id %s", e.RequestID)
		}
		return msg
	}
	return err.Error()
}

// fenceAdvice says, for each unmet fence of a release or witness refusal, what clears it.
var fenceAdvice = map[string]string{
	"activation":       "the reservation is activated: destroy its takoform_worker_endpoint_activation first",
	"endpoint_present": "an endpoint still stands on the reservation: destroy that takoform_worker_endpoint first",
	"lease_claimed":    "a runtime input holds an unexpired claim on it: it clears when the delivery settles, is aborted or expires (15 minutes)",
	"attestation_open": "the deleted endpoint's deletion attestation is still closing: it clears once the backend confirms the route is gone",
	"deployment_live":  "the deleted endpoint's route may still be live on the backend: it clears once the backend confirms its deletion",
	// A Cloudflare upload of an earlier worker of this script name may still land; the Host reads
	// the script again about 75 s after that upload was read back absent.
	"late_write_recheck": "an interrupted upload of an earlier worker under this script name may still land on Cloudflare: it clears once the Host has read the script again (about two minutes)",
}

// transientFences clear by themselves; the provider waits on them within the resource's timeout.
var transientFences = map[string]bool{"lease_claimed": true, "attestation_open": true, "deployment_live": true, "late_write_recheck": true}

// onlyTransient reports whether every unmet fence of err clears by itself.
func onlyTransient(err error) bool {
	var e *client.Error
	if !errors.As(err, &e) || len(e.UnmetFences) == 0 {
		return false
	}
	for _, f := range e.UnmetFences {
		if !transientFences[f] {
			return false
		}
	}
	return true
}

// addError adds the diagnostic of a failed call: `Unable to <verb> <thing>`, with the Host's code
// and detail, and what to do for the refusals a user can act on.
func addError(diags *diag.Diagnostics, summary string, err error) {
	detail := describe(err)
	var e *client.Error
	var unknown *client.OutcomeUnknownError
	var unreachable *client.UnreachableError
	if errors.As(err, &unreachable) {
		detail += "\n\nOnce the Host answers again, run the apply again: it is safe, since every create, update and delete is " +
			"replayed under the same ownership token. The provider's unreachable_timeout sets how long it waits for a silent Host."
	}
	switch {
	case errors.As(err, &unknown):
		detail += "\n\nThe provider kept the request's ownership token in the state, so nothing is orphaned or duplicated: " +
			"the resource is tainted, and the next apply deletes whatever the request created (with that token) before creating it anew."
	case errors.As(err, &e) && e.Code == "ownership_conflict" && e.Conflict != nil:
		detail += "\n\nThe object exists and another ownership token owns it. To manage it from this configuration, adopt it with an import block:\n\n" +
			e.Conflict.ImportBlock + "\n\nor with the import command:\n\n" + e.Conflict.ImportCommand +
			"\n\n(replace <name> with this resource's name; `tofu import` works the same way)."
	case errors.As(err, &e) && len(e.UnmetFences) > 0:
		detail += "\n\nWhat each unmet fence needs:"
		for _, f := range e.UnmetFences {
			if advice, ok := fenceAdvice[f]; ok {
				detail += "\n  - " + f + ": " + advice
			}
		}
	case errors.As(err, &e) && e.Code == "deployment_brake":
		detail += "\n\nAn operator engaged a deployment brake; nothing in its scope changes until it is released (`takoserver brake deployment off`)."
	}
	diags.AddError(summary, detail)
}
