package server

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/backend"
	"github.com/takoform/terraform-provider-takoform/internal/ownership"
	"github.com/takoform/terraform-provider-takoform/internal/store"
)

// ProblemContentType is the media type of every error body (RFC 9457).
const ProblemContentType = "application/problem+json"

// statuses maps every apierr code to its one HTTP status and title.
var statuses = map[apierr.Code]struct {
	status int
	title  string
}{
	apierr.BadRequest:              {http.StatusBadRequest, "Malformed request"},
	apierr.InvalidRequest:          {http.StatusUnprocessableEntity, "Invalid request"},
	apierr.Unauthenticated:         {http.StatusUnauthorized, "Authentication required"},
	apierr.Forbidden:               {http.StatusForbidden, "Forbidden"},
	apierr.NotFound:                {http.StatusNotFound, "Not found"},
	apierr.MethodNotAllowed:        {http.StatusMethodNotAllowed, "Method not allowed"},
	apierr.OwnershipConflict:       {http.StatusConflict, "Owned by another token"},
	apierr.IntentInProgress:        {http.StatusConflict, "Request in progress"},
	apierr.Tombstoned:              {http.StatusGone, "Object deleted"},
	apierr.OwnershipRequired:       {http.StatusPreconditionRequired, "Ownership token required"},
	apierr.BodyTooLarge:            {http.StatusRequestEntityTooLarge, "Request body too large"},
	apierr.UnsupportedMedia:        {http.StatusUnsupportedMediaType, "Unsupported media type"},
	apierr.OfferingAmbiguous:       {http.StatusUnprocessableEntity, "Offering ambiguous"},
	apierr.OfferingUnknown:         {http.StatusUnprocessableEntity, "Unknown offering"},
	apierr.LabelReserved:           {http.StatusUnprocessableEntity, "Label reserved"},
	apierr.LabelNotSold:            {http.StatusUnprocessableEntity, "Label not sold"},
	apierr.SubdomainNotDerivable:   {http.StatusUnprocessableEntity, "Subdomain not derivable"},
	apierr.HostMintNamespace:       {http.StatusForbidden, "Host-minted namespace"},
	apierr.ReservationConflict:     {http.StatusConflict, "Reservation conflict"},
	apierr.OriginTaken:             {http.StatusConflict, "Origin taken"},
	apierr.ReservationMismatch:     {http.StatusConflict, "Reservation mismatch"},
	apierr.ReleaseFenced:           {http.StatusConflict, "Release fenced"},
	apierr.PlacementDrift:          {http.StatusConflict, "Placement drift"},
	apierr.DeploymentBrake:         {http.StatusLocked, "Deployment brake engaged"},
	apierr.NotImplemented:          {http.StatusNotImplemented, "Not implemented"},
	apierr.BackendFailed:           {http.StatusBadGateway, "Backend failed"},
	apierr.BackendMisconfigured:    {http.StatusBadGateway, "Backend misconfigured"},
	apierr.DeploymentFailed:        {http.StatusUnprocessableEntity, "Deployment failed"},
	apierr.BackendUnreachable:      {http.StatusServiceUnavailable, "Backend unreachable"},
	apierr.WorkerNotReady:          {http.StatusConflict, "Worker not ready"},
	apierr.WorkerHasEndpoints:      {http.StatusConflict, "Worker has endpoints"},
	apierr.WorkerHasCallers:        {http.StatusConflict, "Worker has callers"},
	apierr.LogsUnsupported:         {http.StatusNotImplemented, "Logs unsupported"},
	apierr.CronsUnsupported:        {http.StatusUnprocessableEntity, "Crons unsupported"},
	apierr.DomainTaken:             {http.StatusConflict, "Domain taken"},
	apierr.DomainReserved:          {http.StatusUnprocessableEntity, "Domain reserved"},
	apierr.DomainInUse:             {http.StatusConflict, "Domain in use"},
	apierr.DomainNotVerified:       {http.StatusUnprocessableEntity, "Domain not verified"},
	apierr.CustomDomainUnsupported: {http.StatusUnprocessableEntity, "Custom domains unsupported"},
	apierr.EndpointActivated:       {http.StatusConflict, "Endpoint activated"},
	apierr.ResourceExists:          {http.StatusConflict, "Resource exists"},
	apierr.Immutable:               {http.StatusConflict, "Cannot change in place"},
	apierr.BoundElsewhere:          {http.StatusConflict, "Reservation bound elsewhere"},
	apierr.ReservationNotLive:      {http.StatusConflict, "Reservation not live"},
	apierr.ActivationMismatch:      {http.StatusConflict, "Activation mismatch"},
	apierr.ReferenceMismatch:       {http.StatusUnprocessableEntity, "Reference mismatch"},
	apierr.TargetMismatch:          {http.StatusUnprocessableEntity, "Target mismatch"},
	apierr.LeaseClaimed:            {http.StatusConflict, "Runtime input claimed"},
	apierr.LeaseUnavailable:        {http.StatusConflict, "Runtime input unavailable"},
	apierr.SealedMaterial:          {http.StatusConflict, "Sealed material unreadable"},
	apierr.RevisionConflict:        {http.StatusConflict, "Revision conflict"},
	apierr.WitnessOpen:             {http.StatusConflict, "Witness still open"},
	apierr.ScriptHeld:              {http.StatusConflict, "Script name held"},
	apierr.QuotaExceeded:           {http.StatusTooManyRequests, "Quota exceeded"},
	apierr.RateLimited:             {http.StatusTooManyRequests, "Too many requests"},
	apierr.Conflict:                {http.StatusConflict, "Conflict"},
	apierr.Internal:                {http.StatusInternalServerError, "Internal error"},
	apierr.Unavailable:             {http.StatusServiceUnavailable, "Service unavailable"},
}

// ProblemCodes maps every code the Host answers with to its status (the API document
// lists the same, a test checks it).
func ProblemCodes() map[apierr.Code]int {
	out := make(map[apierr.Code]int, len(statuses))
	for c, st := range statuses {
		out[c] = st.status
	}
	return out
}

// KnownCode reports whether code has a status in the table.
func KnownCode(code apierr.Code) bool {
	_, ok := statuses[code]
	return ok
}

// codeForStatus is used for errors raised by echo itself (unknown route, wrong method, ...).
var codeForStatus = map[int]apierr.Code{
	http.StatusBadRequest:            apierr.BadRequest,
	http.StatusUnauthorized:          apierr.Unauthenticated,
	http.StatusForbidden:             apierr.Forbidden,
	http.StatusNotFound:              apierr.NotFound,
	http.StatusMethodNotAllowed:      apierr.MethodNotAllowed,
	http.StatusRequestEntityTooLarge: apierr.BodyTooLarge,
	http.StatusUnsupportedMediaType:  apierr.UnsupportedMedia,
	http.StatusServiceUnavailable:    apierr.Unavailable,
}

// problemType names a code as a URI, as RFC 9457 asks.
func problemType(code apierr.Code) string { return "urn:takoform:problem:" + string(code) }

// handleError is echo's error handler: the one place an error becomes a response.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	reqID := requestID(c)
	var ae *apierr.Error
	var he *echo.HTTPError
	if refusal := s.schemaMismatch(c, err); refusal != nil {
		err = refusal
	}
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, store.ErrContention):
		// Deadlocks, serialization failures and lock timeouts clear by themselves (SPEC 2).
		ae = &apierr.Error{Code: apierr.IntentInProgress, Detail: "concurrent requests on the same objects collided; retry"}
	case errors.Is(err, store.ErrUnavailable) || errors.Is(store.Classify(err), store.ErrUnavailable):
		s.log.LogAttrs(c.Request().Context(), slog.LevelError, "database unavailable",
			slog.String("request_id", reqID), slog.String("route", routeOf(c)), slog.String("error", err.Error()))
		ae = &apierr.Error{Code: apierr.Unavailable, Detail: "the Host cannot reach its database; retry shortly"}
	case errors.Is(err, backend.ErrUnreachable):
		// A backend that could not be reached on a path that does not say so itself (the recovery
		// of an interrupted operation, reading a pool member back): the caller retries.
		ae = &apierr.Error{Code: apierr.BackendUnreachable, Detail: "the backend could not be reached; apply again to retry"}
	case errors.As(err, &he):
		code, ok := codeForStatus[he.Code]
		if !ok {
			code = apierr.Internal
		}
		detail := http.StatusText(he.Code)
		if msg, ok := he.Message.(string); ok && he.Code < 500 {
			detail = msg
		}
		ae = &apierr.Error{Code: code, Detail: detail}
	default:
		ae = &apierr.Error{Code: apierr.Internal}
	}
	st, ok := statuses[ae.Code]
	if !ok {
		st = statuses[apierr.Internal]
		ae = &apierr.Error{Code: apierr.Internal}
	}
	// backend_misconfigured's detail names the installation for its operator (never a credential).
	if st.status >= 500 && ae.Code != apierr.Unavailable && ae.Code != apierr.BackendFailed && ae.Code != apierr.BackendUnreachable && ae.Code != apierr.BackendMisconfigured {
		// The cause goes to the log, never to the caller; the request id links the two.
		s.log.LogAttrs(c.Request().Context(), slog.LevelError, "request failed",
			slog.String("request_id", reqID), slog.String("route", routeOf(c)), slog.String("error", err.Error()))
		ae = &apierr.Error{Code: ae.Code, Detail: publicDetail(ae)}
	}
	body := map[string]any{}
	for k, v := range ae.Extensions {
		body[k] = v
	}
	body["type"] = problemType(ae.Code)
	body["title"] = st.title
	body["status"] = st.status
	body["detail"] = ae.Detail
	body["code"] = string(ae.Code)
	body["requestId"] = reqID
	c.Set(ctxProblemCode, string(ae.Code)) // for the request's log line and metrics
	raw, mErr := json.Marshal(body)
	if mErr != nil {
		raw = []byte(`{"type":"urn:takoform:problem:internal","title":"Internal error","status":500,"code":"internal"}`)
		st.status = http.StatusInternalServerError
	}
	if secs, ok := ae.Extensions["retryAfterSeconds"].(int); ok && secs > 0 {
		// A backend's own Retry-After (Cloudflare's rate-limit block).
		c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
	}
	if apierr.Retryable(ae.Code) && c.Response().Header().Get("Retry-After") == "" {
		// The rate limiter sets its own (when its key's bucket holds a token again).
		c.Response().Header().Set("Retry-After", strconv.Itoa(ownership.RetryAfterSeconds))
	}
	if st.status == http.StatusUnauthorized {
		c.Response().Header().Set("WWW-Authenticate", `Bearer realm="takoserver"`)
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(st.status)
		return
	}
	_ = c.Blob(st.status, ProblemContentType, raw)
}

// publicDetail is what a 5xx answer says in place of its cause: a generic sentence, except for
// not_implemented and logs_unsupported, whose detail is a sentence of ours naming what this Host or pack does not offer.
func publicDetail(ae *apierr.Error) string {
	if ae.Code == apierr.NotImplemented || ae.Code == apierr.LogsUnsupported {
		return ae.Detail
	}
	return "The Host could not complete the request. Quote the request id when reporting it."
}
