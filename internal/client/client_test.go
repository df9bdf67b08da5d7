package client

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
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
	status, err := c.Do(context.Background(), Request{Method: http.MethodPut, Path: "/v1/x", Body: map[string]string{"a": "b"}, OwnershipToken: "token-0123456789abcdef"}, nil)
	require.NoError(t, err)
	require.Equal(t, 200, status)
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
	require.True(t, IsCode(err, "some_code"))
	require.Len(t, f.headers, 3)
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
