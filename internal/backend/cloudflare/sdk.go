// Package cloudflare is the `workers-dev` and `wfp-managed` backend packs (SPEC 8): one mutator for
// both (scripts.go: the Workers scripts; routes.go: the workers.dev route or the dispatch
// namespace's routing entry; limits.go, delivery.go, dispatch_install.go, ratelimit.go), built on
// the Cloudflare Go SDK's services with the SDK discipline, the request parameters of a module
// Worker upload, and Cloudflare's errors read back as typed values.
//
// The SDK discipline: each installation's services are built from explicit options only
// (WithBaseURL, WithAPIToken, WithMaxRetries(0)). The SDK's root client is never used, because
// cloudflare.NewClient starts from DefaultClientOptions, which read CLOUDFLARE_API_TOKEN,
// CLOUDFLARE_BASE_URL and the other CLOUDFLARE_* variables; and the SDK's own retries (10 by
// default) are switched off, because a retry after a lost answer would resend a secret-bearing
// upload. Retries are the pack's. No debug logging middleware is ever installed.
package cloudflare

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cloudflare/cloudflare-go/v6/custom_hostnames"
	"github.com/cloudflare/cloudflare-go/v6/kv"
	"github.com/cloudflare/cloudflare-go/v6/option"
	"github.com/cloudflare/cloudflare-go/v6/workers"
	"github.com/cloudflare/cloudflare-go/v6/workers_for_platforms"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// DefaultBaseURL is Cloudflare's API v4.
const DefaultBaseURL = "https://api.cloudflare.com/client/v4/"

// Options are everything a Services is built from; nothing comes from the environment.
type Options struct {
	// BaseURL of the API (default DefaultBaseURL); tests and Cloudflare-compatible gateways set it.
	BaseURL string
	// Token is the installation's API token.
	Token vocab.Secret
	// HTTPClient carries the requests (default: a client with a 60 s timeout).
	HTTPClient *http.Client
}

// Services are the SDK services the packs call, each bound to one installation's options.
type Services struct {
	// Scripts: account Workers scripts (upload, delete, list, content) and, through its fields,
	// their subdomain route (Scripts.Subdomain), settings readback
	// (Scripts.ScriptAndVersionSettings) and secrets (Scripts.Secrets).
	Scripts *workers.ScriptService
	// Subdomains: the account's workers.dev subdomain.
	Subdomains *workers.SubdomainService
	// DispatchNamespaces: Workers for Platforms namespaces and, through Scripts, the scripts in
	// them.
	DispatchNamespaces *workers_for_platforms.DispatchNamespaceService
	// KVValues: Workers KV values.
	KVValues *kv.NamespaceValueService
	// CustomHostnames: Cloudflare for SaaS custom hostnames of the operator's zone (custom domains
	// on wfp-managed, SPEC 3.7).
	CustomHostnames *custom_hostnames.CustomHostnameService
}

// New builds the services of one installation.
func New(o Options) (*Services, error) {
	base := o.BaseURL
	if base == "" {
		base = DefaultBaseURL
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("cloudflare: apiBaseUrl %q is not an http(s) URL", base)
	}
	if o.Token.Reveal() == "" {
		return nil, errors.New("cloudflare: the API token is empty")
	}
	client := o.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: 60 * time.Second}
	}
	opts := []option.RequestOption{
		option.WithBaseURL(base),
		option.WithAPIToken(o.Token.Reveal()),
		option.WithMaxRetries(0),
		option.WithHTTPClient(client),
	}
	return &Services{
		Scripts:            workers.NewScriptService(opts...),
		Subdomains:         workers.NewSubdomainService(opts...),
		DispatchNamespaces: workers_for_platforms.NewDispatchNamespaceService(opts...),
		KVValues:           kv.NewNamespaceValueService(opts...),
		CustomHostnames:    custom_hostnames.NewCustomHostnameService(opts...),
	}, nil
}

// APIError is an answer of Cloudflare's API other than success: its status, Retry-After (for
// 429) and the envelope's errors. It never holds the request, so it cannot show the token.
type APIError struct {
	Status     int
	RetryAfter time.Duration
	Errors     []ErrorEntry
}

// ErrorEntry is one entry of the envelope's errors.
type ErrorEntry struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func (e *APIError) Error() string {
	parts := make([]string, 0, len(e.Errors))
	for _, x := range e.Errors {
		parts = append(parts, fmt.Sprintf("%d %s", x.Code, x.Message))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("cloudflare API answered %d", e.Status)
	}
	return fmt.Sprintf("cloudflare API answered %d: %s", e.Status, strings.Join(parts, "; "))
}

// Message is the envelope's messages joined, for a problem's detail (Cloudflare's words).
func (e *APIError) Message() string {
	parts := make([]string, 0, len(e.Errors))
	for _, x := range e.Errors {
		parts = append(parts, x.Message)
	}
	return strings.Join(parts, "; ")
}

// HasCode reports whether any entry carries one of codes.
func (e *APIError) HasCode(codes ...int) bool {
	for _, x := range e.Errors {
		for _, c := range codes {
			if x.Code == c {
				return true
			}
		}
	}
	return false
}

// Cloudflare's codes that SPEC 8 maps.
var (
	// AuthCodes are authentication and permission failures (502 backend_misconfigured).
	AuthCodes = []int{9106, 9109, 10000, 10023}
	// RefusedScriptCodes are scripts Cloudflare refuses (422 deployment_failed).
	RefusedScriptCodes = []int{10006, 10021, 10027}
)

// CodeNotFound is Cloudflare's not-found (workers.api.error.script_not_found), the witness of
// absence.
const CodeNotFound = 10007

// IsNotFound reports a script (or workers.dev subdomain) that does not exist.
func (e *APIError) IsNotFound() bool {
	return e.Status == http.StatusNotFound && e.HasCode(CodeNotFound)
}

// IsAuth reports an authentication or permission failure.
func (e *APIError) IsAuth() bool { return e.HasCode(AuthCodes...) }

// IsRefusedScript reports a script Cloudflare refuses (syntax, size, compatibility).
func (e *APIError) IsRefusedScript() bool { return e.HasCode(RefusedScriptCodes...) }

// IsRateLimited reports a 429.
func (e *APIError) IsRateLimited() bool { return e.Status == http.StatusTooManyRequests }
