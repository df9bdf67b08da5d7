package server_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// follow is one open log follow stream: ended is closed when the Host ends it, stop ends it from
// the client's side.
type follow struct {
	status int
	// header and body are a refusal's (the stream was not opened).
	header http.Header
	body   string
	ended  <-chan struct{}
	stop   context.CancelFunc
}

// openFollow opens a log follow stream with key and reads it in the background.
func (h *harness) openFollow(key string) follow {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	h.t.Cleanup(cancel)
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url+logsPath+"?follow=true", nil)
	require.NoError(h.t, err)
	hr.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(hr)
	require.NoError(h.t, err)
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return follow{status: resp.StatusCode, header: resp.Header, body: string(body), stop: cancel}
	}
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
	return follow{status: resp.StatusCode, ended: ended, stop: cancel}
}

func (f follow) endsWithin(t *testing.T, d time.Duration, why string) {
	t.Helper()
	select {
	case <-f.ended:
	case <-time.After(d):
		t.Fatalf("the follow stream did not end within %s: %s", d, why)
	}
}

// TestRuleLogFollowStreamsAreBoundedPerKeyAndOrganization (issue 32 item 10): a key opens at most
// its cap of follow streams on a replica and its organization at most the organization's; one
// more is 429 with Retry-After, a read without follow is never refused, and a stream that ends
// gives its place back.
func TestRuleLogFollowStreamsAreBoundedPerKeyAndOrganization(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.logStreamsPerKey, o.logStreamsPerOrg = 2, 3 })
	h.deployLogWorker()
	other := h.keyWith(h.org.Name).Key

	first := h.openFollow(h.key)
	require.Equal(t, http.StatusOK, first.status)
	require.Equal(t, http.StatusOK, h.openFollow(h.key).status)
	refused := h.openFollow(h.key)
	require.Equal(t, http.StatusTooManyRequests, refused.status, "a third stream of the key")
	require.Contains(t, refused.body, `"code":"rate_limited"`)
	require.NotEmpty(t, refused.header.Get("Retry-After"))
	require.Contains(t, refused.body, "API key")
	require.Equal(t, http.StatusOK, h.openFollow(other).status, "another key of the organization has its own cap")
	refused = h.openFollow(other)
	require.Equal(t, http.StatusTooManyRequests, refused.status, "a fourth stream of the organization")
	require.Contains(t, refused.body, "organization")
	require.Equal(t, http.StatusOK, h.do(req{method: http.MethodGet, path: logsPath, key: h.key}).status, "a read without follow is not a stream")

	first.stop()
	require.Eventually(t, func() bool {
		f := h.openFollow(other)
		return f.status == http.StatusOK
	}, 10*time.Second, 50*time.Millisecond, "the stream that ended gave its place back")
}

// TestRuleALogFollowStreamEndsAtItsMaximumAge: a follow stream ends (cleanly) once it has lasted
// the Host's maximum age; its client reconnects with since.
func TestRuleALogFollowStreamEndsAtItsMaximumAge(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) { o.logStreamAge = time.Second })
	h.deployLogWorker()
	f := h.openFollow(h.key)
	require.Equal(t, http.StatusOK, f.status)
	f.endsWithin(t, 10*time.Second, "its maximum age is one second")
}

// TestRuleALogFollowStreamEndsWithItsWorker: a follow stream of a worker that is deleted ends,
// instead of waiting for entries that never come.
func TestRuleALogFollowStreamEndsWithItsWorker(t *testing.T) {
	t.Parallel()
	h := setup(t)
	h.deployLogWorker()
	f := h.openFollow(h.key)
	require.Equal(t, http.StatusOK, f.status)
	require.Equal(t, http.StatusOK, h.deleteEndpoint("prod", "api", endpointToken).status)
	require.Equal(t, http.StatusOK, h.deleteWorker("prod", "api", workerToken).status)
	f.endsWithin(t, 30*time.Second, "its worker was deleted")
}
