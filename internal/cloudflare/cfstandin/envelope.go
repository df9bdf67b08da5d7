package cfstandin

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error codes the stand-in answers with, as Cloudflare publishes them for API v4 (the Workers
// "errors on Worker upload" table, the API's authentication and rate-limit codes, and the codes
// Workers KV answers with). Where Cloudflare's documentation names no code for a case, the
// comment says so and the stand-in uses the nearest published one.
const (
	// CodeRateLimited is Cloudflare's "please wait and consider throttling your request speed"
	// (HTTP 429), for the 1,200 requests / 5 minutes per token limit and the block after it.
	CodeRateLimited = 971
	// CodeMissingCredentials: "Missing X-Auth-Key, X-Auth-Email or Authorization headers".
	CodeMissingCredentials = 9106
	// CodeInvalidToken: "Invalid access token" (a bearer token Cloudflare does not know).
	CodeInvalidToken = 9109
	// CodeAuthentication: "Authentication error" (a known token used on an account or a route
	// it has no permission for).
	CodeAuthentication = 10000
	// CodeParseScript: "Could not parse your Worker's code".
	CodeParseScript = 10006
	// CodeNotFound: "Worker or workers.dev subdomain not found" (workers.api.error.script_not_found).
	// The stand-in also answers it for an unknown dispatch namespace and an unknown secret, for
	// which Cloudflare publishes no code of their own.
	CodeNotFound = 10007
	// CodeInternal: "An unknown error has occurred" (the 5xx answers of the Workers API).
	CodeInternal = 10013
	// CodeInvalidName: "Invalid Worker name".
	CodeInvalidName = 10016
	// CodeValidation: "Validation Error" (the script failed to start, a binding could not be
	// resolved, an unsupported compatibility date or flag).
	CodeValidation = 10021
	// CodeBadRequestBody: "Could not parse request body".
	CodeBadRequestBody = 10026
	// CodeScriptTooLarge: workers.api.error.script_too_large.
	CodeScriptTooLarge = 10027
	// CodeTooManyScripts: "An account has exceeded the number of Workers allowed".
	CodeTooManyScripts = 10037
	// CodeBindingWithoutName: "A binding is uploaded without a name".
	CodeBindingWithoutName = 10052
	// CodeBindingTooLarge: "A environment variable or secret exceeds the size limit".
	CodeBindingTooLarge = 10054
	// CodeTooManyBindings: "The number of environment variables or secrets exceeds the limit".
	CodeTooManyBindings = 10055
	// CodeKVKeyNotFound is Workers KV's "get: 'key not found'".
	CodeKVKeyNotFound = 10009
	// CodeKVNamespaceNotFound is Workers KV's "namespace not found".
	CodeKVNamespaceNotFound = 10013
	// CodeServiceBindingUnresolved: a service binding's target script could not be resolved.
	// Cloudflare resolves a `service` binding at account scope only, so a dispatch-namespace
	// script binding to a sibling in its namespace is refused with it.
	CodeServiceBindingUnresolved = 10143
	// CodeNoRoute is the API's "No route for that URI" (an unknown path).
	CodeNoRoute = 7000
)

// APIError is one entry of an envelope's errors.
type APIError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

// envelope is Cloudflare's API v4 response body.
type envelope struct {
	Success    bool        `json:"success"`
	Errors     []APIError  `json:"errors"`
	Messages   []APIError  `json:"messages"`
	Result     any         `json:"result"`
	ResultInfo *resultInfo `json:"result_info,omitempty"`
}

type resultInfo struct {
	Page       int `json:"page"`
	PerPage    int `json:"per_page"`
	Count      int `json:"count"`
	TotalCount int `json:"total_count"`
}

// failure is a refusal the handlers return: the HTTP status and Cloudflare's errors.
type failure struct {
	status     int
	errors     []APIError
	retryAfter int // seconds, for 429
}

func (f *failure) Error() string {
	if len(f.errors) == 0 {
		return http.StatusText(f.status)
	}
	return strconv.Itoa(f.errors[0].Code) + ": " + f.errors[0].Message
}

func fail(status, code int, message string) *failure {
	return &failure{status: status, errors: []APIError{{Code: code, Message: message}}}
}

func notFound(message string) *failure { return fail(http.StatusNotFound, CodeNotFound, message) }

func validation(message string) *failure {
	return fail(http.StatusBadRequest, CodeValidation, message)
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

func writeResult(w http.ResponseWriter, result any) {
	writeJSON(w, http.StatusOK, envelope{Success: true, Errors: []APIError{}, Messages: []APIError{}, Result: result})
}

func writeList(w http.ResponseWriter, items []any) {
	writeJSON(w, http.StatusOK, envelope{
		Success: true, Errors: []APIError{}, Messages: []APIError{}, Result: items,
		ResultInfo: &resultInfo{Page: 1, PerPage: len(items), Count: len(items), TotalCount: len(items)},
	})
}

func writeFailure(w http.ResponseWriter, f *failure) {
	if f.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(f.retryAfter))
	}
	writeJSON(w, f.status, envelope{Success: false, Errors: f.errors, Messages: []APIError{}, Result: nil})
}
