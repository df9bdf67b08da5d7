// Package client is the provider's one way to reach the Host's public API (api/openapi.yaml; a
// test checks every type here against the document). It authenticates with the organization API
// key, retries what SPEC 4 lists as retryable with backoff and Retry-After, always resending the
// same ownership token, and turns problem+json answers into *Error.
//
// A Client holds the state of one provider configuration (the capabilities check, the
// organization id): OpenTofu's provider for_each makes several in one process, so nothing here is
// a package global.
package client

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// OwnershipProtocol is the capability the client requires before any mutation.
const OwnershipProtocol = "takoform-ownership-v1"

// Header names of the ownership protocol (SPEC 3.2).
const (
	TokenHeader    = "Takoform-Ownership-Token"
	ReplayedHeader = "Takoform-Replayed"
)

// LogFunc receives one line about a request: never a body, never a header value.
type LogFunc func(ctx context.Context, msg string, fields map[string]any)

// Config configures a Client.
type Config struct {
	Endpoint string
	APIKey   string
	// OrganizationID is the API key's organization, needed by the runtime-input routes. When
	// empty it is taken from GET /v1/capabilities, if the Host tells it there.
	OrganizationID string
	// Timeout bounds one HTTP request.
	Timeout time.Duration
	// MaxRetries bounds the retries of a read. Owned mutations are replay-safe and are retried
	// until their context ends (the resource's timeout), as SPEC 4 requires.
	MaxRetries int
	UserAgent  string
	// HTTPClient is used when set (tests); otherwise one with Timeout is made.
	HTTPClient *http.Client
	// Log, when set, is told about every attempt (method, path, status, code; nothing else).
	Log LogFunc
	// Unreachable bounds how long a request keeps being retried while the Host gives no answer
	// at all (connection refused or reset, no answer within Timeout): past it the request fails
	// with *UnreachableError, even an owned mutation whose resource timeout is further away, so
	// that a stopped Host is reported in minutes rather than at the end of the timeout. Zero
	// means DefaultUnreachable.
	Unreachable time.Duration
	// EndpointFrom says where Endpoint came from (the TAKOFORM_ENDPOINT variable or the
	// provider's endpoint attribute), for the messages about a Host that does not answer.
	EndpointFrom string
	// Warn, when set, is told while the Host does not answer, every WarnInterval(Unreachable).
	Warn LogFunc
}

// DefaultUnreachable is how long a Host may give no answer before a request fails. A provider has
// no way to show progress while a resource operation runs (its diagnostics reach the CLI when the
// operation ends), so the error is how the CLI's output says the Host is silent: by default within
// 30 seconds of the silence starting.
const DefaultUnreachable = 30 * time.Second

// Outage bounds how long a request keeps being retried while the Host answers `503 unavailable`
// (it is up, its database is not: a managed PostgreSQL failing over takes 30 s to 2 minutes), when
// that is longer than the unreachable bound. Those answers do not count toward max_retries.
const Outage = 2 * time.Minute

// WarnInterval is how often a request says that the Host has not answered: every 30 s, or more
// often when the bound is short, so that a few warnings come before the failure.
func WarnInterval(unreachable time.Duration) time.Duration {
	return min(30*time.Second, unreachable/4)
}

// Client talks to one Host for one provider configuration.
type Client struct {
	base       *url.URL
	apiKey     string
	maxRetries int
	// outage is Outage (tests shorten it).
	outage    time.Duration
	userAgent string
	http      *http.Client
	log       LogFunc
	warn      LogFunc
	// unreachable bounds the retries while the Host does not answer; endpointFrom names the
	// endpoint's source in what is said about it.
	unreachable  time.Duration
	endpointFrom string

	capsMu sync.Mutex
	caps   *Capabilities // what the Host said, once it answered
	// offerings are GET /v1/offerings's, once it answered (offeringsMu).
	offeringsMu sync.Mutex
	offerings   []Offering
	orgID       string
}

// Error is a problem answer from the Host.
type Error struct {
	Status int
	Code   string
	Detail string
	// RequestID links the answer to the Host's log.
	RequestID string
	// UnmetFences lists the fences of a release_fenced or witness_open refusal.
	UnmetFences []string
	// Conflict names the existing object of an ownership_conflict.
	Conflict *Conflict
	// RetryAfter is the Host's Retry-After, when it sent one.
	RetryAfter time.Duration
}

// Conflict is the `conflict` member of an ownership_conflict problem.
type Conflict struct {
	Kind          string `json:"kind"`
	ID            string `json:"id"`
	UID           string `json:"uid"`
	ImportCommand string `json:"importCommand"`
	ImportBlock   string `json:"importBlock"`
}

func (e *Error) Error() string {
	msg := fmt.Sprintf("the Host answered %d %s", e.Status, e.Code)
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.RequestID != "" {
		msg += " (request id " + e.RequestID + ")"
	}
	return msg
}

// IsCode reports whether err is a Host problem with code.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsNotFound reports whether err is a 404.
func IsNotFound(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Status == http.StatusNotFound
}

// OutcomeUnknownError means a mutation was sent, perhaps more than once with the same ownership
// token, and no answer came back before the context ended: the Host may or may not have done it.
type OutcomeUnknownError struct {
	Method, Path string
	Err          error
}

func (e *OutcomeUnknownError) Error() string {
	return fmt.Sprintf("%s %s: no answer from the Host before the timeout, so the outcome is unknown (last error: %v)", e.Method, e.Path, e.Err)
}

func (e *OutcomeUnknownError) Unwrap() error { return e.Err }

// New validates cfg and returns a Client. It does not contact the Host.
func New(cfg Config) (*Client, error) {
	if cfg.Endpoint == "" {
		return nil, errors.New("no endpoint: set endpoint in the provider block or TAKOFORM_ENDPOINT")
	}
	base, err := url.Parse(strings.TrimRight(cfg.Endpoint, "/"))
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return nil, fmt.Errorf("endpoint %q must be an http:// or https:// URL", cfg.Endpoint)
	}
	if cfg.APIKey == "" {
		return nil, errors.New("no API key: set api_key in the provider block or TAKOFORM_API_KEY")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxRetries < 0 {
		return nil, errors.New("max_retries must not be negative")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		// The CLI calls a provider for up to ten resources at once (-parallelism, more when
		// raised): keep a warm connection for each, where net/http's default keeps two per host
		// and dials again, and drops, the rest on every call.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		hc = &http.Client{Timeout: cfg.Timeout, Transport: t}
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = "terraform-provider-takoform"
	}
	if cfg.Unreachable < 0 {
		return nil, errors.New("the unreachable bound must not be negative")
	}
	if cfg.Unreachable == 0 {
		cfg.Unreachable = DefaultUnreachable
	}
	if cfg.EndpointFrom == "" {
		cfg.EndpointFrom = "the provider's endpoint or TAKOFORM_ENDPOINT"
	}
	return &Client{
		base: base, apiKey: cfg.APIKey, maxRetries: cfg.MaxRetries, outage: Outage, userAgent: ua, http: hc, log: cfg.Log, warn: cfg.Warn,
		unreachable: cfg.Unreachable, endpointFrom: cfg.EndpointFrom, orgID: cfg.OrganizationID,
	}, nil
}

// Request is one call to the Host.
type Request struct {
	Method string
	Path   string
	// Query is added to Path's URL (nil: none).
	Query url.Values
	Body  any
	// OwnershipToken is sent unchanged on every attempt, so that a retry is a replay.
	OwnershipToken string
	// IfMatch is the revision the caller last read; it makes an update fail on a stale revision.
	IfMatch int64
	// gzip: the encoded body is gzip-compressed (Content-Encoding: gzip).
	gzip bool
}

// maxAnswer bounds an answer the client reads: a worker's projection carries its bundle, base64
// bytes modules included (4/3 of the largest bundle ceiling, 20 MiB, and room beside).
const maxAnswer = 32 << 20

// compressAbove is the body size past which a request is sent gzip-compressed (SPEC 3.6: a
// worker's bundle may reach 10 MiB; a minified bundle compresses to a quarter or less).
const compressAbove = 64 << 10

// gzipped is b gzip-compressed.
func gzipped(b []byte) ([]byte, error) {
	var out bytes.Buffer
	w, err := gzip.NewWriterLevel(&out, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// Response describes a successful answer.
type Response struct {
	Status   int
	Replayed bool
}

// Do sends req, retrying transient failures, and decodes a 2xx JSON answer into out (when not
// nil).
func (c *Client) Do(ctx context.Context, req Request, out any) (Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = json.Marshal(req.Body); err != nil {
			return Response{}, fmt.Errorf("encode request: %w", err)
		}
		if len(body) > compressAbove {
			if body, err = gzipped(body); err != nil {
				return Response{}, fmt.Errorf("encode request: %w", err)
			}
			req.gzip = true
		}
	}
	owned := req.OwnershipToken != ""
	_, hasDeadline := ctx.Deadline()
	u := c.base.JoinPath(req.Path)
	if len(req.Query) > 0 {
		u.RawQuery = req.Query.Encode()
	}
	target := u.String()
	sent := false
	// quiet is the current stretch without an answer from the Host; it starts with each
	// request sent and ends with any answer.
	var quiet *silence
	defer func() { quiet.end() }()
	// refused counts the answers that asked for a retry (a 5xx, a 429, a retryable 409): max_retries
	// bounds those. A Host that does not answer at all is bounded by unreachable_timeout instead,
	// the same for every request (SPEC 4).
	refused := 0
	// outage is when the current run of `503 unavailable` answers began (zero: none).
	var outage time.Time
	for attempt := 0; ; attempt++ {
		if quiet == nil {
			quiet = c.startSilence(ctx, req, time.Now())
		}
		// A mutation that was sent (or may have reached the Host) is bounded only by the
		// resource's timeout, replayed with its token: unreachable_timeout alone never makes its
		// outcome unknown (SPEC 4). Reads, plans and tries that never connected keep the bound.
		replaying := owned && sent && hasDeadline
		quiet.replaying.Store(replaying)
		resp, connected, err := c.attempt(ctx, quiet, replaying, req, target, body, out)
		answered := resp.Status != 0
		// A try that never got a connection (refused, no route) carried nothing; any other
		// failure without an answer may have delivered the request, one cut short by the
		// caller's own deadline too.
		sent = sent || !answered && connected && err != nil
		replaying = owned && sent && hasDeadline
		if answered {
			quiet.end()
			quiet = nil
		} else if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			quiet.cause = err
		}
		if err == nil {
			return resp, nil
		}
		if !retryable(ctx, resp.Status, err) {
			if !answered && ctx.Err() != nil {
				// The caller's deadline ended the try: a mutation it carried may have landed.
				return resp, c.giveUp(req, owned, sent, quiet.fail(err))
			}
			return resp, err
		}
		// Owned mutations are replay-safe: they are retried until the resource's timeout. A Host
		// whose database is down answers 503 unavailable: that is waited out for the outage
		// bound, not counted as a refusal.
		down := resp.Status == http.StatusServiceUnavailable && IsCode(err, "unavailable")
		switch {
		case down && outage.IsZero():
			outage = time.Now()
		case answered && !down:
			outage = time.Time{}
			refused++
		}
		if (!owned || !hasDeadline) && answered && refused > c.maxRetries {
			return resp, c.giveUp(req, owned, sent, quiet.fail(err))
		}
		if (!owned || !hasDeadline) && down && time.Since(outage) > max(c.outage, c.unreachable) {
			return resp, c.giveUp(req, owned, sent, quiet.fail(err))
		}
		wait := backoff(attempt, retryAfter(err))
		if quiet != nil && !replaying {
			// A Host that has not answered for the whole bound is reported now, not at the
			// resource's timeout; until then it is tried again, the last time at the bound.
			left := time.Until(quiet.since.Add(c.unreachable))
			if left <= 0 {
				return resp, c.giveUp(req, owned, sent, quiet.fail(err))
			}
			wait = min(wait, left)
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait {
			return resp, c.giveUp(req, owned, sent, quiet.fail(err))
		}
		c.logf(ctx, "retrying a request to the Host", map[string]any{"method": req.Method, "path": req.Path, "attempt": attempt + 1, "wait": wait.String(), "reason": reason(resp.Status, err)})
		select {
		case <-ctx.Done():
			return resp, c.giveUp(req, owned, sent, quiet.fail(err))
		case <-time.After(wait):
		}
	}
}

// attempt is one try of req; connected reports whether it got a connection to send it on. It
// ends when the unreachable bound does, so that a Host that accepts connections and never
// answers is bounded like one that refuses them, and after half the bound at most, so that a
// Host busy with a long call (a deploy waits up to a minute for its worker) is asked again
// within the bound and answers that (a replay, or 409 intent_in_progress) instead of reading as
// silent. The effective timeout of one try is the shortest of Timeout and those two.
//
// A replay (a sent mutation, see Do) is not held to the silence's bound: each of its tries still
// ends after half the bound, so that it asks again.
func (c *Client) attempt(ctx context.Context, quiet *silence, replaying bool, req Request, target string, body []byte, out any) (Response, bool, error) {
	deadline := quiet.since.Add(c.unreachable)
	if half := time.Now().Add(c.unreachable / 2); half.Before(deadline) || replaying {
		deadline = half
	}
	limit := time.Until(deadline)
	actx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	var connected atomic.Bool
	actx = httptrace.WithClientTrace(actx, &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	resp, err := c.once(actx, req, target, body, out)
	if err != nil && ctx.Err() == nil && actx.Err() != nil {
		err = fmt.Errorf("%s %s: no answer within %s: %w", req.Method, req.Path, limit.Round(time.Millisecond), err)
	}
	return resp, connected.Load(), err
}

// UnreachableError means the Host gave no answer at all (connection refused, reset or timed out)
// for the client's unreachable bound. Whatever was asked can be asked again: owned mutations are
// replays under the same ownership token.
type UnreachableError struct {
	// Endpoint is the Host's base URL, without any userinfo.
	Endpoint string
	// From says where the endpoint was configured.
	From string
	// For is how long the Host has not answered.
	For time.Duration
	Err error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("the Host at %s (from %s) has not answered for %s (last error: %v); check that takoserver is running and reachable there, or point %s at it",
		e.Endpoint, e.From, e.For.Round(time.Second), e.Err, e.From)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// silence is a stretch of attempts without an answer from the Host: it began at since, and a
// goroutine warns every WarnInterval until it ends.
type silence struct {
	c     *Client
	since time.Time
	stop  chan struct{}
	done  chan struct{}
	// cause is the last failure that says more than a deadline (connection refused, reset).
	cause error
	// replaying: the request may have reached the Host, and is asked again until the resource's
	// timeout rather than the bound (the warnings say so).
	replaying atomic.Bool
}

func (c *Client) startSilence(ctx context.Context, req Request, since time.Time) *silence {
	s := &silence{c: c, since: since, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(WarnInterval(c.unreachable))
		defer tick.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-ctx.Done():
				return
			case now := <-tick.C:
				if c.warn == nil {
					continue
				}
				quietFor := now.Sub(since).Round(time.Second)
				if s.replaying.Load() {
					c.warn(ctx, fmt.Sprintf("the Takoform Host at %s (from %s) has not answered for %s; the request may have reached it, so it is sent again with its ownership token (a replay, never a second object) until the resource's timeout",
						c.base.Redacted(), c.endpointFrom, quietFor), map[string]any{"method": req.Method, "path": req.Path})
					continue
				}
				c.warn(ctx, fmt.Sprintf("the Takoform Host at %s (from %s) has not answered for %s; retrying until %s without an answer, then failing (the apply can be re-run safely once the Host is back)",
					c.base.Redacted(), c.endpointFrom, quietFor, c.unreachable), map[string]any{"method": req.Method, "path": req.Path})
			}
		}
	}()
	return s
}

// end stops the warnings; it is safe on nil and twice.
func (s *silence) end() {
	if s == nil {
		return
	}
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// fail is the error of a request given up during the silence: the unreachable Host, named.
func (s *silence) fail(err error) error {
	if s == nil {
		return err
	}
	if s.cause != nil && errors.Is(err, context.DeadlineExceeded) {
		err = s.cause // the try cut at the bound says less than the one before it
	}
	return &UnreachableError{Endpoint: s.c.base.Redacted(), From: s.c.endpointFrom, For: time.Since(s.since), Err: err}
}

// giveUp returns the final error: a mutation that may have landed reports an unknown outcome.
func (c *Client) giveUp(req Request, owned, sent bool, err error) error {
	if owned && sent {
		return &OutcomeUnknownError{Method: req.Method, Path: req.Path, Err: err}
	}
	return err
}

func reason(status int, err error) string {
	var e *Error
	if errors.As(err, &e) {
		return fmt.Sprintf("%d %s", e.Status, e.Code)
	}
	if status == 0 {
		return "no answer"
	}
	return strconv.Itoa(status)
}

func retryAfter(err error) time.Duration {
	var e *Error
	if errors.As(err, &e) {
		return e.RetryAfter
	}
	return 0
}

// retryable is SPEC 4's list: connection errors (and a request's own timeout, a lost answer)
// while the caller still waits, 429 (but quota_exceeded, which clears only when the organization
// deletes something or an operator raises its ceiling), 5xx (but 501, which never clears, and 502
// backend_misconfigured, a backend refusing the installation's credentials, which an operator must
// fix), and the retryable 409s intent_in_progress and witness_open.
func retryable(ctx context.Context, status int, err error) bool {
	switch {
	case status == 0:
		return ctx.Err() == nil
	case status == http.StatusNotImplemented:
		return false
	case status == http.StatusBadGateway && IsCode(err, "backend_misconfigured"):
		return false
	case status == http.StatusTooManyRequests:
		return !IsCode(err, "quota_exceeded")
	case status >= 500:
		return true
	}
	return IsCode(err, "intent_in_progress") || IsCode(err, "witness_open")
}

func backoff(attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, 30*time.Second)
	}
	d := time.Duration(200*(1<<min(attempt, 5))) * time.Millisecond
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}

func (c *Client) logf(ctx context.Context, msg string, fields map[string]any) {
	if c.log != nil {
		c.log(ctx, msg, fields)
	}
}

func (c *Client) once(ctx context.Context, req Request, target string, body []byte, out any) (Response, error) {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, target, reader)
	if err != nil {
		return Response{}, err
	}
	hr.Header.Set("Authorization", "Bearer "+c.apiKey)
	hr.Header.Set("Accept", "application/json, application/problem+json")
	hr.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if req.gzip {
		hr.Header.Set("Content-Encoding", "gzip")
	}
	if req.OwnershipToken != "" {
		hr.Header.Set(TokenHeader, req.OwnershipToken)
	}
	if req.IfMatch > 0 {
		hr.Header.Set("If-Match", strconv.FormatInt(req.IfMatch, 10))
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		// A transport error names the URL, never the request's headers (which carry the key).
		c.logf(ctx, "request to the Host got no answer", map[string]any{"method": req.Method, "path": req.Path, "error": err.Error()})
		return Response{}, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		// The status arrived but the body did not: for a mutation that is a lost answer.
		return Response{}, fmt.Errorf("%s %s: read answer: %w", req.Method, req.Path, err)
	}
	out2 := Response{Status: resp.StatusCode, Replayed: resp.Header.Get(ReplayedHeader) == "true"}
	c.logf(ctx, "request to the Host answered", map[string]any{"method": req.Method, "path": req.Path, "status": resp.StatusCode, "replayed": out2.Replayed})
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out != nil && len(raw) > 0 {
			if err := json.Unmarshal(raw, out); err != nil {
				return out2, fmt.Errorf("%s %s: decode answer: %w", req.Method, req.Path, err)
			}
		}
		return out2, nil
	}
	return out2, problem(resp, raw)
}

func problem(resp *http.Response, raw []byte) *Error {
	e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id"), RetryAfter: parseRetryAfter(resp.Header.Get("Retry-After"))}
	var p struct {
		Code        string    `json:"code"`
		Detail      string    `json:"detail"`
		RequestID   string    `json:"requestId"`
		UnmetFences []string  `json:"unmetFences"`
		Conflict    *Conflict `json:"conflict"`
	}
	if json.Unmarshal(raw, &p) == nil {
		e.Code, e.Detail, e.UnmetFences, e.Conflict = p.Code, p.Detail, p.UnmetFences, p.Conflict
		if e.RequestID == "" {
			e.RequestID = p.RequestID
		}
	}
	if e.Code == "" {
		e.Code = "http_" + strconv.Itoa(resp.StatusCode)
	}
	return e
}

func parseRetryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

// Capabilities asks the Host what it supports.
func (c *Client) Capabilities(ctx context.Context) (Capabilities, error) {
	var out Capabilities
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/capabilities"}, &out)
	return out, err
}

// discovered is what GET /v1/capabilities said, asked once per configuration: the first caller
// asks while concurrent ones wait for its answer; a failure is not remembered, so the next caller
// asks again.
func (c *Client) discovered(ctx context.Context) (Capabilities, error) {
	c.capsMu.Lock()
	defer c.capsMu.Unlock()
	if c.caps != nil {
		return *c.caps, nil
	}
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return Capabilities{}, err
	}
	c.caps = &caps
	return caps, nil
}

// RequireOwnership fails closed unless the Host advertises the ownership protocol (without it no
// mutation may be sent) and, when organization_id is configured, the key belongs to it.
func (c *Client) RequireOwnership(ctx context.Context) error {
	caps, err := c.discovered(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(caps.Ownership, OwnershipProtocol) {
		return fmt.Errorf("the Host does not advertise %s; refusing to mutate anything", OwnershipProtocol)
	}
	return c.mismatch(caps)
}

// OrganizationID returns the API key's organization id, as the Host states it (or as configured,
// for a Host that does not state it).
func (c *Client) OrganizationID(ctx context.Context) (string, error) {
	caps, err := c.discovered(ctx)
	if err != nil {
		return "", err
	}
	return c.organization(caps)
}

// mismatch refuses a configured organization_id that is not the key's.
func (c *Client) mismatch(caps Capabilities) error {
	if caps.OrganizationID != "" && c.orgID != "" && c.orgID != caps.OrganizationID {
		return fmt.Errorf("organization_id is %q but the API key belongs to organization %q: remove organization_id (the Host states the key's organization) or use a key of %q",
			c.orgID, caps.OrganizationID, c.orgID)
	}
	return nil
}

func (c *Client) organization(caps Capabilities) (string, error) {
	if err := c.mismatch(caps); err != nil {
		return "", err
	}
	switch {
	case caps.OrganizationID != "":
		return caps.OrganizationID, nil
	case c.orgID != "":
		return c.orgID, nil
	}
	return "", errors.New("the Host does not tell which organization the API key belongs to, and the runtime-input routes need it: " +
		"set organization_id in the provider block or TAKOFORM_ORGANIZATION_ID (`takoserver keys create --output json` prints it as organizationId)")
}
