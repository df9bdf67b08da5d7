// Package selfhost is the `selfhost` backend pack: its mutator (node.go, inventory.go) and the
// Host's client of a runtime node's admin API (SPEC 5), through which the pack drives the runtime
// the way the Cloudflare packs drive Cloudflare. Of the runtime it imports only the shared wire
// types (internal/runtime/adminapi).
//
// Every admin call is safe to repeat (mutations are idempotent by effect id, deletes are
// conditional, the readback is a read), so a call that could not reach the runtime is retried with
// backoff until its context ends. Refusals are *ProblemError; an unreachable runtime is
// ErrNodeUnreachable, which the pack reports as backend.ErrUnreachable.
package selfhost

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// maxBackoff caps the delay between two tries of one call.
const maxBackoff = 2 * time.Second

// ErrNodeUnreachable wraps every failure to get an answer from the runtime node.
var ErrNodeUnreachable = errors.New("runtime node unreachable")

// ProblemError is a refusal from the runtime node.
type ProblemError struct {
	StatusCode int
	Problem    adminapi.Problem
}

func (e *ProblemError) Error() string {
	return fmt.Sprintf("runtime node refused: %s", e.Problem.Error())
}

// IsCode reports whether err is a refusal with this problem code.
func IsCode(err error, code string) bool {
	var p *ProblemError
	return errors.As(err, &p) && p.Problem.Code == code
}

// Client talks to one runtime node.
type Client struct {
	baseURL string
	// tokenFile is where the token was read from ("" for NewWithToken): read again after a 401,
	// so that a node's new token reaches a running Host without a restart.
	tokenFile string
	mu        sync.Mutex
	token     string
	http      *http.Client
	// Log, when set, is told when the node refuses the token (never the token itself).
	Log *slog.Logger
	// Attempts bounds the tries of one call that cannot reach the runtime (default 4); the call's
	// context bounds them too.
	Attempts int
	// Backoff is the first retry delay, doubling.
	Backoff time.Duration
	// Once, when set and true at a call, makes that call try once: a node that has been silent
	// long enough is asked, not waited on again.
	Once func() bool
}

// Config says how to reach one runtime node: its admin URL, its token file and, for https://, how
// to trust it and how to prove who is calling (SPEC 5.1, control channel).
type Config struct {
	// URL is the admin API's base URL. http:// is only for a loopback host: the token and secret
	// deliveries would otherwise cross the network in clear.
	URL       string
	TokenFile string
	// CAFile (PEM) replaces the system roots for verifying the runtime's admin certificate: the
	// private CA that issued it.
	CAFile string
	// ClientCertFile and ClientKeyFile (PEM) are presented for mutual TLS. They are read again at
	// every handshake, so a renewed certificate is used without a restart.
	ClientCertFile string
	ClientKeyFile  string
}

// New reads the admin token from tokenFile and returns a client of the node at baseURL
// (http://127.0.0.1:8788 by default on a dev machine). Per-call deadlines come from the contexts
// passed to each method; a call with none gets 30 seconds.
func New(baseURL, tokenFile string) (*Client, error) {
	return NewFromConfig(Config{URL: baseURL, TokenFile: tokenFile})
}

// NewFromConfig is New with TLS settings.
func NewFromConfig(cfg Config) (*Client, error) {
	tlsConfig, err := clientTLS(cfg)
	if err != nil {
		return nil, err
	}
	token, err := readToken(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	c := NewWithToken(cfg.URL, token)
	c.tokenFile = cfg.TokenFile
	c.http.Transport.(*http.Transport).TLSClientConfig = tlsConfig
	return c, nil
}

// readToken reads the token file again.
func readToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("read the runtime's admin token: %w", err)
	}
	token := strings.TrimSpace(string(b))
	if token == "" {
		return "", fmt.Errorf("the runtime's admin token file %s is empty", file)
	}
	return token, nil
}

// refused answers a 401 from the node: when the token file now holds another token (the node's
// token was rotated), the client takes it and says to try again; otherwise the refusal is logged,
// naming the node and the file, and stands.
func (c *Client) refused(ctx context.Context, method, path string, sent string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != sent {
		return true // another call already took a new token
	}
	if c.tokenFile != "" {
		if token, err := readToken(c.tokenFile); err == nil && token != c.token {
			c.token = token
			c.logger().InfoContext(ctx, "runtime node refused the admin token; read the token file again and took its new token",
				"runtime_url", c.baseURL, "token_file", c.tokenFile)
			return true
		}
	}
	c.logger().ErrorContext(ctx, "runtime node refused the Host's admin token (401): the node's token and the installation's runtimeTokenFile differ",
		"runtime_url", c.baseURL, "token_file", c.tokenFile, "method", method, "path", path)
	return false
}

func (c *Client) logger() *slog.Logger {
	if c.Log != nil {
		return c.Log
	}
	return slog.Default()
}

// clientTLS checks the URL against the TLS settings and builds the TLS configuration (nil for
// http:// to a loopback host).
func clientTLS(cfg Config) (*tls.Config, error) {
	u, err := url.Parse(cfg.URL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("runtime URL %q must be an http:// or https:// base URL", cfg.URL)
	}
	if (cfg.ClientCertFile == "") != (cfg.ClientKeyFile == "") {
		return nil, errors.New("a runtime client certificate and its key go together")
	}
	if u.Scheme == "http" {
		if !LoopbackHost(u.Hostname()) {
			return nil, fmt.Errorf("refusing http:// to %s: the runtime's admin token and secret deliveries would cross the network in clear; use https://", u.Host)
		}
		if cfg.CAFile != "" || cfg.ClientCertFile != "" {
			return nil, fmt.Errorf("a runtime CA or client certificate needs an https:// runtime URL, not %s", cfg.URL)
		}
		return nil, nil
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("read the runtime's CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("the runtime's CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tlsConfig.RootCAs = pool
	}
	if cfg.ClientCertFile != "" {
		load := func() (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(cfg.ClientCertFile, cfg.ClientKeyFile)
			if err != nil {
				return nil, fmt.Errorf("runtime client certificate: %w", err)
			}
			return &cert, nil
		}
		if _, err := load(); err != nil {
			return nil, err
		}
		tlsConfig.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return load() }
	}
	return tlsConfig, nil
}

// LoopbackHost reports whether host (a URL's host name, without port) is loopback: "localhost" or
// a loopback IP. Other names are not: what they resolve to can change.
func LoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// NewWithToken is New with the token in hand, over plain http or the system's roots, with no check
// of the URL (tests).
func NewWithToken(baseURL, token string) *Client {
	return &Client{
		baseURL:  strings.TrimRight(baseURL, "/"),
		token:    token,
		http:     &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}},
		Attempts: 4,
		Backoff:  100 * time.Millisecond,
	}
}

// BaseURL is the node's admin URL.
func (c *Client) BaseURL() string { return c.baseURL }

// PutScript declares a script's desired deployment.
func (c *Client) PutScript(ctx context.Context, scriptName string, req adminapi.ScriptPut) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	return out, c.do(ctx, http.MethodPut, adminapi.ScriptPath(scriptName), req, &out)
}

// GetScript reads what the runtime holds and runs for a script.
func (c *Client) GetScript(ctx context.Context, scriptName string) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	return out, c.do(ctx, http.MethodGet, adminapi.ScriptPath(scriptName), nil, &out)
}

// WatchScript reads a script as a long poll: the answer comes once its status differs from the
// version since, or when wait (at most adminapi.StatusWaitMax) has passed. A runtime that does not
// know the long poll answers at once.
func (c *Client) WatchScript(ctx context.Context, scriptName, since string, wait time.Duration) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	ctx, cancel := context.WithTimeout(ctx, wait+30*time.Second)
	defer cancel()
	return out, c.do(ctx, http.MethodGet, adminapi.ScriptWatchPath(scriptName, since, wait), nil, &out)
}

// DeleteScript removes the script if it still belongs to workerUID; the answer says what is there
// afterwards (present with another worker UID when a successor holds the name).
func (c *Client) DeleteScript(ctx context.Context, scriptName, workerUID string) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	return out, c.do(ctx, http.MethodDelete, adminapi.ScriptDeletePath(scriptName, workerUID), nil, &out)
}

// PutSecrets delivers one worker UID's secret values. They travel in this request body only.
func (c *Client) PutSecrets(ctx context.Context, scriptName string, req adminapi.SecretsPut) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	return out, c.do(ctx, http.MethodPut, adminapi.SecretsPath(scriptName), req, &out)
}

// DeleteSecrets erases a script's delivery if it still belongs to workerUID.
func (c *Client) DeleteSecrets(ctx context.Context, scriptName, workerUID string) (adminapi.ScriptStatus, error) {
	var out adminapi.ScriptStatus
	return out, c.do(ctx, http.MethodDelete, adminapi.SecretsDeletePath(scriptName, workerUID), nil, &out)
}

// Readback sends a challenge (32 bytes, sent as standard base64) and returns the runtime's keyed
// digest of the bindings it gives workerd. concludes, when not empty, names the delivery whose
// lease the answer decides: if the script does not hold it, the runtime refuses it from then on.
func (c *Client) Readback(ctx context.Context, scriptName string, challenge []byte, concludes string) (adminapi.Readback, error) {
	var out adminapi.Readback
	return out, c.do(ctx, http.MethodPost, adminapi.ReadbackPath(scriptName), adminapi.ReadbackRequest{Challenge: encodeChallenge(challenge), Concludes: concludes}, &out)
}

// Logs reads a page of a worker's log (adminapi: Worker logs); with q.Wait it is a long poll, and
// the call's deadline should leave it room.
func (c *Client) Logs(ctx context.Context, scriptName string, q adminapi.LogQuery) (adminapi.LogPage, error) {
	var out adminapi.LogPage
	return out, c.do(ctx, http.MethodGet, adminapi.LogsPath(scriptName, q), nil, &out)
}

// RunScheduled asks the node to run one cron tick of a script's worker (at most once per tick id).
func (c *Client) RunScheduled(ctx context.Context, scriptName string, req adminapi.ScheduledRun) (adminapi.ScheduledOutcome, error) {
	var out adminapi.ScheduledOutcome
	return out, c.do(ctx, http.MethodPost, adminapi.ScheduledPath(scriptName), req, &out)
}

// PutRoute installs hostname → script for one endpoint UID.
func (c *Client) PutRoute(ctx context.Context, hostname string, req adminapi.RoutePut) (adminapi.RouteStatus, error) {
	var out adminapi.RouteStatus
	return out, c.do(ctx, http.MethodPut, adminapi.RoutePath(hostname), req, &out)
}

// GetRoute reads one hostname's route.
func (c *Client) GetRoute(ctx context.Context, hostname string) (adminapi.RouteStatus, error) {
	var out adminapi.RouteStatus
	return out, c.do(ctx, http.MethodGet, adminapi.RoutePath(hostname), nil, &out)
}

// DeleteRoute removes the route only while it maps hostname to scriptName for endpointUID; the
// answer is what is there afterwards (absent, or a successor's route, left alone).
func (c *Client) DeleteRoute(ctx context.Context, hostname, scriptName, endpointUID string) (adminapi.RouteStatus, error) {
	var out adminapi.RouteStatus
	return out, c.do(ctx, http.MethodDelete, adminapi.RouteDeletePath(hostname, scriptName, endpointUID), nil, &out)
}

// Status reads every script, route and brake.
// Pool reads which pool key the node holds.
func (c *Client) Pool(ctx context.Context) (adminapi.Pool, error) {
	var out adminapi.Pool
	return out, c.do(ctx, http.MethodGet, adminapi.PathPool, nil, &out)
}

// Membership reads the node's place in its pool, as it holds it (SPEC 6.2).
func (c *Client) Membership(ctx context.Context) (adminapi.MembershipStatus, error) {
	var out adminapi.MembershipStatus
	return out, c.do(ctx, http.MethodGet, adminapi.PathMembership, nil, &out)
}

// SetMembership tells the node its place in its pool, and confirms it.
func (c *Client) SetMembership(ctx context.Context, m adminapi.Membership) (adminapi.MembershipStatus, error) {
	var out adminapi.MembershipStatus
	return out, c.do(ctx, http.MethodPut, adminapi.PathMembership, m, &out)
}

// Reseal asks the node to seal a pool blob again to its current pool key.
func (c *Client) Reseal(ctx context.Context, req adminapi.Reseal) (adminapi.Reseal, error) {
	var out adminapi.Reseal
	return out, c.do(ctx, http.MethodPost, adminapi.PathPoolReseal, req, &out)
}

func (c *Client) Status(ctx context.Context) (adminapi.Status, error) {
	var out adminapi.Status
	return out, c.do(ctx, http.MethodGet, adminapi.PathStatus, nil, &out)
}

// SetLifecycleBrake engages or releases the lifecycle brake of one scope.
func (c *Client) SetLifecycleBrake(ctx context.Context, engaged bool, scope adminapi.BrakeScope) (adminapi.Brakes, error) {
	var out adminapi.Brakes
	return out, c.do(ctx, http.MethodPost, adminapi.PathLifecycleBrake, adminapi.BrakeSet{Engaged: engaged, Scope: scope}, &out)
}

// Brakes lists the engaged brakes.
func (c *Client) Brakes(ctx context.Context) (adminapi.Brakes, error) {
	var out adminapi.Brakes
	return out, c.do(ctx, http.MethodGet, adminapi.PathBrakes, nil, &out)
}

// do sends one call, retrying while the runtime cannot be reached. Every call of this API may be
// repeated (see the package comment), so a lost answer is safe to ask again.
func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return fmt.Errorf("encode %s %s: %w", method, path, err)
		}
	}
	backoff := c.Backoff
	attempts := c.Attempts
	if c.Once != nil && c.Once() {
		attempts = 1
	}
	var lastErr error
	reread := false
	for attempt := 1; ; attempt++ {
		c.mu.Lock()
		token := c.token
		c.mu.Unlock()
		err := c.once(ctx, method, path, token, payload, out)
		var pe *ProblemError
		if errors.As(err, &pe) && pe.StatusCode == http.StatusUnauthorized && !reread {
			reread = true
			if c.refused(ctx, method, path, token) {
				attempt--
				continue
			}
		}
		if err == nil || !errors.Is(err, ErrNodeUnreachable) {
			return err
		}
		lastErr = err
		if attempt >= attempts {
			return lastErr
		}
		select {
		case <-ctx.Done():
			return lastErr
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxBackoff)
	}
}

func (c *Client) once(ctx context.Context, method, path, token string, payload []byte, out any) error {
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.baseURL+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	if payload != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		// The transport error names only the URL, never the body.
		return fmt.Errorf("%w: %s %s: %v", ErrNodeUnreachable, method, path, unwrapURLError(err))
	}
	defer resp.Body.Close()
	if w, ok := out.(stream); ok && resp.StatusCode < 300 {
		if _, err := io.Copy(w.Writer, resp.Body); err != nil {
			return fmt.Errorf("%s %s: reading the answer: %w", method, path, err)
		}
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("%w: %s %s: reading the answer: %v", ErrNodeUnreachable, method, path, err)
	}
	if resp.StatusCode >= 300 {
		pe := &ProblemError{StatusCode: resp.StatusCode}
		if json.Unmarshal(b, &pe.Problem) != nil || pe.Problem.Code == "" {
			switch resp.StatusCode {
			case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
				// A proxy or load balancer in front of the node answered for it: the node did not.
				return fmt.Errorf("%w: %s %s: %d from a gateway in front of the node", ErrNodeUnreachable, method, path, resp.StatusCode)
			}
			pe.Problem = *adminapi.NewProblem(resp.StatusCode, "http_"+fmt.Sprint(resp.StatusCode), http.StatusText(resp.StatusCode), "the runtime node answered without a problem document")
		}
		return pe
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("decode the answer to %s %s: %w", method, path, err)
		}
	}
	return nil
}

// stream is an answer copied as it comes to its writer, whatever its size.
type stream struct{ io.Writer }

// Backup writes a backup of the node's state to w (GET /v1/backup): one try, never repeated, since
// w may hold part of an answer that broke off.
func (c *Client) Backup(ctx context.Context, w io.Writer) error {
	c.mu.Lock()
	token := c.token
	c.mu.Unlock()
	return c.once(ctx, http.MethodGet, adminapi.PathBackup, token, nil, stream{w})
}

func unwrapURLError(err error) error {
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return opErr
	}
	return err
}

func encodeChallenge(c []byte) string { return base64.StdEncoding.EncodeToString(c) }
