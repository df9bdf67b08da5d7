package backend

import (
	"errors"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
)

// Problem is the Host's answer to a backend's typed refusal (SPEC 8 "Errors"), or nil when err is
// none of them. again tells the caller what to do about a rate limit ("apply again", or "nothing
// was claimed: apply again" where a one-shot lease was spared).
func Problem(err error, again string) error {
	var refused *RefusedError
	var limited *RateLimitedError
	switch {
	case errors.As(err, &limited):
		// The rate limit outlasted the request's retries: nothing was applied.
		secs := max(1, int(limited.RetryAfter.Seconds()+0.999))
		return apierr.New(apierr.BackendUnreachable, "%s; %s after %d s", limited.Error(), again, secs).With("retryAfterSeconds", secs)
	case errors.Is(err, ErrMisconfigured):
		return apierr.New(apierr.BackendMisconfigured, "%s", err.Error())
	case errors.As(err, &refused):
		return apierr.New(apierr.DeploymentFailed, "the backend refused the code: %s; fix it and apply again (the previous deployment, if any, keeps serving)", refused.Message)
	case errors.Is(err, ErrPlacementDrift):
		return apierr.New(apierr.PlacementDrift, "%s", err.Error())
	case errors.Is(err, ErrNotImplemented):
		return apierr.New(apierr.NotImplemented, "%s", err.Error())
	}
	return nil
}
