// Package client is the provider's one way to reach the Host's public API. It authenticates with
// the organization API key, retries what is safe to retry (429, 5xx, connection errors) with
// backoff and Retry-After, and turns problem+json answers into *Error.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// OwnershipProtocol is the capability the client requires before any mutation.
const OwnershipProtocol = "takoform-ownership-v1"

// Config configures a Client.
type Config struct {
	Endpoint   string
	APIKey     string
	Timeout    time.Duration
	MaxRetries int
	UserAgent  string
	// HTTPClient is used when set (tests); otherwise one with Timeout is made.
	HTTPClient *http.Client
}

// Client talks to one Host.
type Client struct {
	base       *url.URL
	apiKey     string
	maxRetries int
	userAgent  string
	http       *http.Client
}

// Error is a problem answer from the Host.
type Error struct {
	Status int
	Code   string
	Title  string
	Detail string
	// RequestID links the answer to the Host's log.
	RequestID string
	// Raw holds every member of the problem, for details such as unmetFences.
	Raw map[string]any
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
		hc = &http.Client{Timeout: cfg.Timeout}
	}
	ua := cfg.UserAgent
	if ua == "" {
		ua = "terraform-provider-takoform"
	}
	return &Client{base: base, apiKey: cfg.APIKey, maxRetries: cfg.MaxRetries, userAgent: ua, http: hc}, nil
}

// Request is one call to the Host.
type Request struct {
	Method string
	Path   string
	Body   any
	// OwnershipToken is sent unchanged on every attempt, so that a retry is a replay.
	OwnershipToken string
}

// Do sends req, retrying transient failures, and decodes a 2xx JSON answer into out (when not
// nil). It returns the final status.
func (c *Client) Do(ctx context.Context, req Request, out any) (int, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = json.Marshal(req.Body); err != nil {
			return 0, fmt.Errorf("encode request: %w", err)
		}
	}
	target := c.base.JoinPath(req.Path)
	for attempt := 0; ; attempt++ {
		status, retryAfter, err := c.once(ctx, req, target.String(), body, out)
		if err == nil || attempt >= c.maxRetries || !retryable(status, err) {
			return status, err
		}
		wait := backoff(attempt, retryAfter)
		select {
		case <-ctx.Done():
			return status, fmt.Errorf("%w (gave up waiting to retry: %v)", err, ctx.Err())
		case <-time.After(wait):
		}
	}
}

func retryable(status int, err error) bool {
	if status == 0 {
		return !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded)
	}
	return status == http.StatusTooManyRequests || status >= 500 || IsCode(err, "intent_in_progress")
}

func backoff(attempt int, retryAfter time.Duration) time.Duration {
	if retryAfter > 0 {
		return min(retryAfter, time.Minute)
	}
	d := time.Duration(250*(1<<min(attempt, 6))) * time.Millisecond
	return d/2 + rand.N(d/2+1)
}

func (c *Client) once(ctx context.Context, req Request, target string, body []byte, out any) (int, time.Duration, error) {
	var reader io.Reader
	if body != nil {
		reader = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.Method, target, reader)
	if err != nil {
		return 0, 0, err
	}
	hr.Header.Set("Authorization", "Bearer "+c.apiKey)
	hr.Header.Set("Accept", "application/json, application/problem+json")
	hr.Header.Set("User-Agent", c.userAgent)
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if req.OwnershipToken != "" {
		hr.Header.Set("Takoform-Ownership-Token", req.OwnershipToken)
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return 0, 0, fmt.Errorf("%s %s: %w", req.Method, req.Path, redactURLError(err))
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return resp.StatusCode, 0, fmt.Errorf("%s %s: read answer: %w", req.Method, req.Path, err)
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		if out != nil && len(raw) > 0 {
			if err := json.Unmarshal(raw, out); err != nil {
				return resp.StatusCode, 0, fmt.Errorf("%s %s: decode answer: %w", req.Method, req.Path, err)
			}
		}
		return resp.StatusCode, 0, nil
	}
	return resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After")), problem(resp, raw)
}

func problem(resp *http.Response, raw []byte) *Error {
	e := &Error{Status: resp.StatusCode, RequestID: resp.Header.Get("X-Request-Id")}
	var m map[string]any
	if json.Unmarshal(raw, &m) == nil {
		e.Raw = m
		e.Code, _ = m["code"].(string)
		e.Title, _ = m["title"].(string)
		e.Detail, _ = m["detail"].(string)
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

// redactURLError keeps a transport error but never the request's headers (which carry the key).
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("%s", ue.Err)
	}
	return err
}

// Capabilities is GET /v1/capabilities.
type Capabilities struct {
	Ownership           []string `json:"ownership"`
	ReservationFormats  []string `json:"reservationFormats"`
	RuntimeInputFormats []string `json:"runtimeInputFormats"`
	Packs               []string `json:"packs"`
}

// Capabilities asks the Host what it supports.
func (c *Client) Capabilities(ctx context.Context) (Capabilities, error) {
	var out Capabilities
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/capabilities"}, &out)
	return out, err
}

// RequireOwnership fails closed unless the Host advertises the ownership protocol: without it no
// mutation may be sent.
func (c *Client) RequireOwnership(ctx context.Context) error {
	caps, err := c.Capabilities(ctx)
	if err != nil {
		return err
	}
	if !slices.Contains(caps.Ownership, OwnershipProtocol) {
		return fmt.Errorf("the Host does not advertise %s; refusing to mutate anything", OwnershipProtocol)
	}
	return nil
}

// Offering is one entry of GET /v1/offerings.
type Offering struct {
	ID           string `json:"id"`
	Kind         string `json:"kind"`
	Pack         string `json:"pack"`
	Installation string `json:"installation"`
	Digest       string `json:"digest"`
}

// Offerings lists the catalog visible to the key's organization.
func (c *Client) Offerings(ctx context.Context) ([]Offering, error) {
	var out struct {
		Offerings []Offering `json:"offerings"`
	}
	_, err := c.Do(ctx, Request{Method: http.MethodGet, Path: "/v1/offerings"}, &out)
	return out.Offerings, err
}
