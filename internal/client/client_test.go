package client

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// flaky answers with the given statuses in turn, recording what each attempt carried.
type flaky struct {
	mu       sync.Mutex
	statuses []int
	headers  []http.Header
}

func (f *flaky) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.headers = append(f.headers, r.Header.Clone())
	status := f.statuses[0]
	if len(f.statuses) > 1 {
		f.statuses = f.statuses[1:]
	}
	if status == http.StatusTooManyRequests {
		w.Header().Set("Retry-After", "0")
	}
	if status >= 400 {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("X-Request-Id", "req-1")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`{"type":"urn:takoform:problem:x","title":"t","status":0,"code":"some_code","detail":"went wrong"}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"ownership":["takoform-ownership-v1"]}`))
}

func newTestClient(t *testing.T, h http.Handler, retries int) *Client {
	t.Helper()
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	c, err := New(Config{Endpoint: ts.URL, APIKey: "tkf_test", MaxRetries: retries, Timeout: 5 * time.Second})
	require.NoError(t, err)
	return c
}

func TestRetriesTransientFailuresWithTheSameToken(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503, 429, 502, 200}}
	c := newTestClient(t, f, 4)
	resp, err := c.Do(context.Background(), Request{Method: http.MethodPut, Path: "/v1/x", Body: map[string]string{"a": "b"}, OwnershipToken: "token-0123456789abcdef"}, nil)
	require.NoError(t, err)
	require.Equal(t, 200, resp.Status)
	require.Len(t, f.headers, 4)
	for _, h := range f.headers {
		require.Equal(t, "token-0123456789abcdef", h.Get("Takoform-Ownership-Token"), "every retry is a replay of the same owned request")
		require.Equal(t, "Bearer tkf_test", h.Get("Authorization"))
	}
}

func TestGivesUpAfterMaxRetries(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{503}}
	c := newTestClient(t, f, 2)
	_, err := c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/x"}, nil)
	require.True(t, IsCode(err, "some_code"), "%v", err)
	require.Len(t, f.headers, 3)
}

func TestRetryableConflictsAreRetriedUntilTheDeadline(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	calls := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n <= 6 {
			w.Header().Set("Retry-After", "0")
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusConflict)
			code := "intent_in_progress"
			if n%2 == 0 {
				code = "witness_open"
			}
			_, _ = w.Write([]byte(`{"code":"` + code + `","detail":"later","unmetFences":["attestation_open"]}`))
			return
		}
		w.Header().Set(ReplayedHeader, "true")
		_, _ = w.Write([]byte(`{}`))
	})
	c := newTestClient(t, h, 1) // max_retries bounds reads; an owned mutation runs to its deadline
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.Do(ctx, Request{Method: http.MethodDelete, Path: "/v1/x", OwnershipToken: "token-0123456789abcdef"}, nil)
	require.NoError(t, err)
	require.True(t, resp.Replayed)
	require.Equal(t, 7, calls)
}

func TestAMutationWithoutAnswerHasAnUnknownOutcome(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	tokens := []string{}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		tokens = append(tokens, r.Header.Get(TokenHeader))
		mu.Unlock()
		// The request is read (it may have landed), then the connection drops without an answer.
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	c := newTestClient(t, h, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Do(ctx, Request{Method: http.MethodPut, Path: "/v1/x", Body: map[string]string{}, OwnershipToken: "token-0123456789abcdef"}, nil)
	var unknown *OutcomeUnknownError
	require.ErrorAs(t, err, &unknown)
	require.Greater(t, len(tokens), 1, "the same request is resent until the deadline")
	for _, tok := range tokens {
		require.Equal(t, "token-0123456789abcdef", tok)
	}
}

func TestConflictDetailsAreDecoded(t *testing.T) {
	t.Parallel()
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusConflict)
		_, _ = w.Write([]byte(`{"code":"ownership_conflict","detail":"owned","requestId":"r-9","conflict":{"kind":"worker","id":"s/n","uid":"u","importCommand":"terraform import takoform_worker.<name> s/n","importBlock":"import {}"}}`))
	})
	c := newTestClient(t, h, 0)
	_, err := c.GetWorker(context.Background(), "s", "n")
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, "r-9", e.RequestID)
	require.Equal(t, "s/n", e.Conflict.ID)
	require.Contains(t, e.Conflict.ImportCommand, "terraform import")
}

// A brake (423) fails an owned mutation at once, with its deadline far away (SPEC 4).
func TestABrakeFailsAMutationAtOnce(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{http.StatusLocked}}
	c := newTestClient(t, f, 4)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := c.Do(ctx, Request{Method: http.MethodPut, Path: "/v1/x", OwnershipToken: "token-0123456789abcdef"}, nil)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, http.StatusLocked, e.Status)
	require.Len(t, f.headers, 1)
}

func TestClientErrorsAreNotRetried(t *testing.T) {
	t.Parallel()
	f := &flaky{statuses: []int{409}}
	c := newTestClient(t, f, 4)
	_, err := c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/x"}, nil)
	var e *Error
	require.ErrorAs(t, err, &e)
	require.Equal(t, 409, e.Status)
	require.Equal(t, "went wrong", e.Detail)
	require.Equal(t, "req-1", e.RequestID)
	require.Len(t, f.headers, 1)
}

func TestRequireOwnershipFailsClosed(t *testing.T) {
	t.Parallel()
	without := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"ownership":[]}`))
	}), 0)
	require.ErrorContains(t, without.RequireOwnership(context.Background()), "refusing to mutate")
	with := newTestClient(t, &flaky{statuses: []int{200}}, 0)
	require.NoError(t, with.RequireOwnership(context.Background()))
}

func TestOrganizationComesFromTheHostAndAConfiguredOneMustMatch(t *testing.T) {
	t.Parallel()
	host := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`{"ownership":["takoform-ownership-v1"],"organizationId":"org_a"}`))
	})
	learned := newTestClient(t, host, 0)
	require.NoError(t, learned.RequireOwnership(context.Background()))
	id, err := learned.OrganizationID(context.Background())
	require.NoError(t, err)
	require.Equal(t, "org_a", id)

	srv := httptest.NewServer(host)
	t.Cleanup(srv.Close)
	other, err := New(Config{Endpoint: srv.URL, APIKey: "k", OrganizationID: "org_b"})
	require.NoError(t, err)
	err = other.RequireOwnership(context.Background())
	require.ErrorContains(t, err, `organization_id is "org_b" but the API key belongs to organization "org_a"`)
}

func TestCapabilitiesAreAskedOncePerConfiguration(t *testing.T) {
	t.Parallel()
	var asked atomic.Int64
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		asked.Add(1)
		time.Sleep(20 * time.Millisecond) // concurrent first callers overlap
		_, _ = w.Write([]byte(`{"ownership":["takoform-ownership-v1"],"organizationId":"org_a"}`))
	}), 0)
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				errs[i] = c.RequireOwnership(context.Background())
			} else {
				_, errs[i] = c.OrganizationID(context.Background())
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(1), asked.Load())
}

func TestNewRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
	_, err := New(Config{APIKey: "k"})
	require.ErrorContains(t, err, "TAKOFORM_ENDPOINT")
	_, err = New(Config{Endpoint: "ftp://x", APIKey: "k"})
	require.ErrorContains(t, err, "http:// or https://")
	_, err = New(Config{Endpoint: "http://x"})
	require.ErrorContains(t, err, "TAKOFORM_API_KEY")
}

func TestTransportErrorsNeverCarryTheKey(t *testing.T) {
	t.Parallel()
	c, err := New(Config{Endpoint: "http://127.0.0.1:1", APIKey: "tkf_secret_value", MaxRetries: 0})
	require.NoError(t, err)
	_, err = c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/capabilities"}, nil)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "tkf_secret_value")
}

// A 429 rate_limited is retried after the Host's Retry-After, with the same token, so an apply
// under the limit succeeds; a 429 quota_exceeded is final and fails at once (SPEC 5.1).
func TestRateLimitsAreWaitedOutButQuotasFailAtOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code  string
		calls int
	}{{"rate_limited", 3}, {"quota_exceeded", 1}} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			retryAfter := ""
			if tc.code == "rate_limited" {
				retryAfter = "1"
			}
			h, sent := twoProblemsThenOK(http.StatusTooManyRequests, tc.code, retryAfter)
			err := ownedPutWithin(newTestClient(t, h, 4), time.Minute)
			at := sent()
			require.Len(t, at, tc.calls)
			if tc.code == "quota_exceeded" {
				require.True(t, IsCode(err, "quota_exceeded"), "%v", err)
				return
			}
			require.NoError(t, err)
			require.GreaterOrEqual(t, at[1].Sub(at[0]), 900*time.Millisecond, "the retry waits out Retry-After")
		})
	}
}

// twoProblemsThenOK answers its first two requests with status and a problem of code (with
// Retry-After when retryAfter is set), and 200 after that; sent says when each request came.
func twoProblemsThenOK(status int, code, retryAfter string) (http.Handler, func() []time.Time) {
	var mu sync.Mutex
	var at []time.Time
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		at = append(at, time.Now())
		n := len(at)
		mu.Unlock()
		if n <= 2 {
			if retryAfter != "" {
				w.Header().Set("Retry-After", retryAfter)
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`{"code":"` + code + `","detail":"not now"}`))
			return
		}
		_, _ = w.Write([]byte(`{}`))
	})
	return h, func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(at)
	}
}

// ownedPutWithin sends one owned PUT under a resource timeout of d.
func ownedPutWithin(c *Client, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := c.Do(ctx, Request{Method: http.MethodPut, Path: "/v1/x", OwnershipToken: "token-0123456789abcdef"}, nil)
	return err
}

// A worker's logs URL is the Host's log route under the configured endpoint (a base path kept,
// credentials in the endpoint never copied into it).
func TestWorkerLogsURL(t *testing.T) {
	t.Parallel()
	for endpoint, want := range map[string]string{
		"http://127.0.0.1:8080":             "http://127.0.0.1:8080/v1/spaces/prod/workers/api/logs",
		"https://host.example/takoform/":    "https://host.example/takoform/v1/spaces/prod/workers/api/logs",
		"https://user:pw@host.example:8443": "https://host.example:8443/v1/spaces/prod/workers/api/logs",
	} {
		c, err := New(Config{Endpoint: endpoint, APIKey: "k"})
		require.NoError(t, err)
		require.Equal(t, want, c.WorkerLogsURL("prod", "api"), endpoint)
	}
}

// TestTenCallsAtOnceKeepTheirConnections: the CLI calls a provider for ten resources at once; the
// client keeps a connection warm for each, so that round after round of ten concurrent calls dials
// ten connections in all, not eight more every round (net/http's default keeps two per host).
func TestTenCallsAtOnceKeepTheirConnections(t *testing.T) {
	t.Parallel()
	const parallel, rounds = 10, 5
	var mu sync.Mutex
	arrived := 0
	all := sync.NewCond(&mu)
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		// Each call waits for the other nine of its round, so that each round needs ten
		// connections at once.
		mu.Lock()
		arrived++
		round := (arrived - 1) / parallel
		all.Broadcast()
		for arrived < (round+1)*parallel {
			all.Wait()
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	var dialed atomic.Int64
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialed.Add(1)
		}
	}
	ts.Start()
	t.Cleanup(ts.Close)
	c, err := New(Config{Endpoint: ts.URL, APIKey: "tkf_test", Timeout: 5 * time.Second})
	require.NoError(t, err)
	for range rounds {
		var wg sync.WaitGroup
		errs := make(chan error, parallel)
		for range parallel {
			wg.Go(func() {
				_, err := c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/x"}, nil)
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	require.Equal(t, int64(parallel), dialed.Load(), "connections dialed over %d rounds of %d calls at once", rounds, parallel)
}

// A 502 backend_misconfigured (the backend refused the installation's credentials: a revoked
// Cloudflare token) is final and fails at once, for an operator to fix; a 502 backend_failed is
// retried (SPEC 4).
func TestBackendMisconfiguredFailsAtOnceOtherBadGatewaysAreRetried(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		code  string
		calls int
	}{{"backend_failed", 3}, {"backend_misconfigured", 1}} {
		t.Run(tc.code, func(t *testing.T) {
			t.Parallel()
			h, sent := twoProblemsThenOK(http.StatusBadGateway, tc.code, "")
			err := ownedPutWithin(newTestClient(t, h, 4), time.Minute)
			require.Len(t, sent(), tc.calls)
			if tc.code == "backend_misconfigured" {
				require.True(t, IsCode(err, "backend_misconfigured"), "%v", err)
				return
			}
			require.NoError(t, err)
		})
	}
}

// down answers 503 unavailable (a Host whose database is failing over) until up, then 200.
type down struct {
	up       atomic.Int64 // Unix nanoseconds
	answered atomic.Int32
}

func (d *down) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	d.answered.Add(1)
	if time.Now().UnixNano() < d.up.Load() {
		w.Header().Set("Content-Type", "application/problem+json")
		w.Header().Set("Retry-After", "0")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte(`{"type":"urn:takoform:problem:unavailable","title":"t","status":503,"code":"unavailable","detail":"the Host cannot reach its database; retry shortly"}`))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{}`))
}

// A read waits out a Host whose database is down (503 unavailable) for the outage bound, however
// many answers that takes, not max_retries of them: a managed database's failover does not fail
// a plan. Past the bound it fails, naming the Host's answer.
func TestAReadWaitsOutADatabaseOutageNotMaxRetries(t *testing.T) {
	t.Parallel()
	d := &down{}
	d.up.Store(time.Now().Add(1500 * time.Millisecond).UnixNano())
	c := newTestClient(t, d, 1)
	c.outage, c.unreachable = 5*time.Second, time.Second
	_, err := c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/x"}, nil)
	require.NoError(t, err, "the outage ended within the bound")
	require.Greater(t, d.answered.Load(), int32(3), "more 503s than max_retries allows for other answers")

	d.up.Store(time.Now().Add(time.Hour).UnixNano())
	c.outage = 800 * time.Millisecond
	start := time.Now()
	_, err = c.Do(context.Background(), Request{Method: http.MethodGet, Path: "/v1/x"}, nil)
	require.True(t, IsCode(err, "unavailable"), "%v", err)
	require.GreaterOrEqual(t, time.Since(start), time.Second, "the bound is the longer of the outage and unreachable bounds")
}

// A body past 64 KiB travels gzip-compressed (a worker's bundle may reach 10 MiB), and a smaller
// one plain; what the Host decompresses is what was encoded.
func TestALargeBodyTravelsCompressed(t *testing.T) {
	t.Parallel()
	var got []struct {
		encoding string
		body     string
	}
	c := newTestClient(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(r.Body)
			if err != nil {
				w.WriteHeader(http.StatusBadRequest)
				return
			}
			in = gz
		}
		b, _ := io.ReadAll(in)
		got = append(got, struct {
			encoding string
			body     string
		}{r.Header.Get("Content-Encoding"), string(b)})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}), 0)
	large := map[string]string{"pad": strings.Repeat("a", 100<<10)}
	for _, body := range []map[string]string{large, {"a": "b"}} {
		_, err := c.Do(context.Background(), Request{Method: http.MethodPut, Path: "/v1/x", Body: body, OwnershipToken: "token-0123456789abcdef"}, nil)
		require.NoError(t, err)
	}
	require.Len(t, got, 2)
	require.Equal(t, "gzip", got[0].encoding)
	want, err := json.Marshal(large)
	require.NoError(t, err)
	require.Equal(t, string(want), got[0].body)
	require.Empty(t, got[1].encoding)
	require.Equal(t, `{"a":"b"}`, got[1].body)
}
