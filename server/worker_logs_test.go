package server_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
	"github.com/takoform/terraform-provider-takoform/server"
)

// logModule prints what it is asked to: a line at each console level, its secret in every form a
// worker could print it, an uncaught exception, or a flood.
const logModule = `export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const secret = env.API_KEY ?? "";
    switch (url.pathname) {
    case "/say":
      console.log("said " + url.searchParams.get("what"));
      console.warn("a warning");
      console.error("an error");
      return new Response("said");
    case "/leak":
      console.log("raw " + secret);
      console.info("b64 " + btoa(secret));
      console.warn("hex " + [...new TextEncoder().encode(secret)].map((b) => b.toString(16).padStart(2, "0")).join(""));
      console.error("env " + JSON.stringify(env));
      console.log("wrapped " + btoa("prefix:" + secret + ":suffix"));
      return new Response("leaked");
    case "/throw":
      throw new Error("thrown on purpose");
    case "/flood":
      for (let i = 0; i < 1000; i++) console.log("flood " + i);
      return new Response("flooded");
    }
    return new Response("hello");
  },
};`

// logLine is one line of a log stream as a client reads it.
type logLine struct {
	Time        time.Time `json:"time"`
	Incarnation string    `json:"incarnation"`
	Level       string    `json:"level"`
	Message     string    `json:"message"`
	Dropped     int       `json:"dropped"`
	Missed      int       `json:"missed"`
}

// deployLogWorker deploys prod/api running logModule with the canary as its API_KEY, behind an
// endpoint, and returns the endpoint's hostname.
func (h *harness) deployLogWorker() string {
	h.t.Helper()
	p := h.reservedAndPrepared()
	body := secretWorkerBody(p.reference)
	body["modules"] = map[string]string{"index.js": logModule}
	w := h.putWorker("prod", "api", workerToken, body)
	require.Equal(h.t, http.StatusCreated, w.status, "body: %s", w.body)
	e := h.mustEndpoint("prod", "api", endpointToken, map[string]any{"worker": "api", "originReservationId": "res-api"})
	return e["hostname"].(string)
}

// call asks the worker at host for path, through the runtime's edge.
func (h *harness) call(host, path string) {
	h.t.Helper()
	status, body, _ := h.runtime.Get(h.t, host, path)
	require.Contains(h.t, []int{http.StatusOK, http.StatusInternalServerError}, status, body)
}

const logsPath = "/v1/spaces/prod/workers/api/logs"

// readLogs reads a whole (not followed) log stream.
func (h *harness) readLogs(key, query string) (reply, []logLine) {
	h.t.Helper()
	r := h.do(req{method: http.MethodGet, path: logsPath + query, key: key})
	if r.status != http.StatusOK {
		return r, nil
	}
	require.Equal(h.t, server.NDJSONContentType, r.header.Get("Content-Type"))
	var lines []logLine
	for _, raw := range strings.Split(strings.TrimSuffix(string(r.body), "\n"), "\n") {
		if raw == "" {
			continue
		}
		var l logLine
		require.NoError(h.t, json.Unmarshal([]byte(raw), &l), "line: %s", raw)
		require.False(h.t, l.Time.IsZero(), "every line has its time: %s", raw)
		lines = append(lines, l)
	}
	return r, lines
}

// eventually reads the log until check finds what it wants in it.
func (h *harness) eventuallyLogs(what string, check func([]logLine) bool) []logLine {
	h.t.Helper()
	var lines []logLine
	pollUntil(h.t, 15*time.Second, func() bool {
		_, lines = h.readLogs(h.key, "")
		return check(lines)
	}, "%s; the log held: %+v", what, &lines)
	return lines
}

func find(lines []logLine, level, message string) *logLine {
	for i := range lines {
		if lines[i].Level == level && strings.Contains(lines[i].Message, message) {
			return &lines[i]
		}
	}
	return nil
}

// A worker's console.log line appears in its log with its level and the incarnation that printed
// it, and so does an exception it did not catch.
func TestWorkerLogShowsConsoleLinesWithLevelAndIncarnationAndUncaughtExceptions(t *testing.T) {
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	h.call(host, "/say?what=hello")
	h.call(host, "/throw")
	lines := h.eventuallyLogs("the lines and the exception", func(l []logLine) bool {
		return find(l, "log", "said hello") != nil && find(l, "exception", "thrown on purpose") != nil
	})
	said := find(lines, "log", "said hello")
	require.Equal(t, "said hello", said.Message)
	require.Regexp(t, `^inc-[0-9a-f]{32}$`, said.Incarnation)
	require.NotNil(t, find(lines, "warn", "a warning"))
	require.NotNil(t, find(lines, "error", "an error"))
	thrown := find(lines, "exception", "thrown on purpose")
	first, stack, _ := strings.Cut(thrown.Message, "\n")
	require.Equal(t, "Uncaught Error: thrown on purpose", first, "as the worker's author would read it, without workerd's internals")
	require.Contains(t, stack, "index.js:", "with its stack in the worker's own modules")
	require.NotContains(t, thrown.Message, "workerd/", "no internals of workerd")
	require.Equal(t, said.Incarnation, thrown.Incarnation)

	// since skips what came before it.
	_, recent := h.readLogs(h.key, "?since="+time.Now().Add(time.Hour).UTC().Format(time.RFC3339))
	require.Empty(t, recent)
	_, recent = h.readLogs(h.key, "?since=1h")
	require.NotNil(t, find(recent, "log", "said hello"))
	h.do(req{method: http.MethodGet, path: logsPath + "?since=yesterday", key: h.key}).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	h.do(req{method: http.MethodGet, path: logsPath + "?follow=maybe", key: h.key}).problem(t, http.StatusUnprocessableEntity, "invalid_request")
}

// A worker that prints its secret (as is, base64, hex, inside JSON or inside a longer base64
// string) gets none of it into its log: the lines are there, the value in no form.
func TestWorkerLogNeverCarriesTheSecretInAnyForm(t *testing.T) {
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	h.call(host, "/leak")
	lines := h.eventuallyLogs("the leaking lines", func(l []logLine) bool { return find(l, "log", "wrapped ") != nil })
	require.NotNil(t, find(lines, "log", "raw [redacted]"))
	require.NotNil(t, find(lines, "info", "b64 [redacted]"))
	require.NotNil(t, find(lines, "warn", "hex [redacted]"))
	require.NotNil(t, find(lines, "error", `env {"API_KEY":"[redacted]"}`))
	secret := []byte(secretCanary)
	text := h.responses.String()
	for _, form := range []string{secretCanary, base64.StdEncoding.EncodeToString(secret), base64.RawStdEncoding.EncodeToString(secret),
		hex.EncodeToString(secret), strings.ToUpper(hex.EncodeToString(secret)), "canary-9d31"} {
		require.NotContains(t, text, form)
	}
	wrapped := find(lines, "log", "wrapped ").Message
	decoded, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(wrapped, "wrapped "))
	require.NotContains(t, string(decoded), "canary", "the base64 of a longer string holding it: %s", wrapped)
	require.NotContains(t, h.logs.String(), secretCanary)
	require.NotContains(t, h.runtime.Logs.String(), secretCanary)
}

// Only the worker's organization reads its log: another organization's key finds no such worker
// (404, the same answer as for a name nobody has), and a key needs resources:read.
func TestWorkerLogIsReadableOnlyByItsOrganization(t *testing.T) {
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	h.call(host, "/say?what=private")
	h.eventuallyLogs("the line", func(l []logLine) bool { return find(l, "log", "said private") != nil })

	_, otherKey := h.newOrg("other")
	r := h.do(req{method: http.MethodGet, path: logsPath, key: otherKey})
	r.problem(t, http.StatusNotFound, "not_found")
	require.NotContains(t, string(r.body), "private")
	r = h.do(req{method: http.MethodGet, path: logsPath + "?follow=true", key: otherKey})
	r.problem(t, http.StatusNotFound, "not_found")
	h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/nobody/logs", key: h.key}).problem(t, http.StatusNotFound, "not_found")
	h.do(req{method: http.MethodGet, path: logsPath}).problem(t, http.StatusUnauthorized, "unauthenticated")
	writeOnly := h.keyWith("acme", "resources:write")
	h.do(req{method: http.MethodGet, path: logsPath, key: writeOnly.Key}).problem(t, http.StatusForbidden, "forbidden")
	readOnly := h.keyWith("acme", "resources:read")
	r, lines := h.readLogs(readOnly.Key, "")
	require.Equal(t, http.StatusOK, r.status)
	require.NotNil(t, find(lines, "log", "said private"))
}

// follow=true keeps the stream open: a line the worker prints after it opened arrives on it, and
// the stream ends when the Host shuts down.
func TestFollowDeliversALinePrintedAfterTheStreamOpened(t *testing.T) {
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	h.call(host, "/say?what=before")
	h.eventuallyLogs("the first line", func(l []logLine) bool { return find(l, "log", "said before") != nil })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, h.url+logsPath+"?follow=true", nil)
	require.NoError(t, err)
	hr.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(hr)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, server.NDJSONContentType, resp.Header.Get("Content-Type"))
	lines := make(chan logLine, 100)
	ended := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			var l logLine
			if json.Unmarshal(sc.Bytes(), &l) == nil {
				lines <- l
			}
		}
		ended <- sc.Err()
	}()
	await := func(message string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case l := <-lines:
				if strings.Contains(l.Message, message) {
					return
				}
			case err := <-ended:
				t.Fatalf("the stream ended (%v) before %q arrived", err, message)
			case <-deadline:
				t.Fatalf("%q never arrived on the followed stream", message)
			}
		}
	}
	await("said before") // the buffer is replayed first
	h.call(host, "/say?what=after-open")
	await("said after-open")

	h.srv.Shutdown()
	select {
	case err := <-ended:
		require.True(t, err == nil || errors.Is(err, io.ErrUnexpectedEOF), "the stream ends cleanly: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the followed stream outlived the Host's shutdown")
	}
}

// A worker that floods its output gets a burst into its log, and the log says how many lines the
// rate limit dropped: every line printed is either in it or counted.
func TestWorkerLogRateLimitDropsAndCounts(t *testing.T) {
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	h.call(host, "/flood")
	count := func(lines []logLine) (kept, dropped int) {
		for _, l := range lines {
			if strings.HasPrefix(l.Message, "flood ") {
				kept++
			}
			dropped += l.Dropped
		}
		return kept, dropped
	}
	lines := h.eventuallyLogs("every line kept or counted", func(l []logLine) bool {
		kept, dropped := count(l)
		return kept+dropped == 1000
	})
	kept, dropped := count(lines)
	require.Positive(t, dropped)
	require.GreaterOrEqual(t, kept, workerlog.LineBurst)
	require.Less(t, kept, 1000)
}

// A followed stream served by Serve outlives the server's write timeout (60 s): each write of the
// stream gets its own deadline. And Serve, told to stop, ends the stream at once rather than
// waiting for it. (It waits past the timeout, so it takes a minute; -short skips it.)
func TestFollowOutlivesTheServersWriteTimeoutAndEndsWithServe(t *testing.T) {
	if testing.Short() {
		t.Skip("waits past the server's write timeout")
	}
	t.Parallel()
	h := setup(t)
	host := h.deployLogWorker()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- h.srv.Serve(ctx, l) }()
	req, _ := http.NewRequest(http.MethodGet, "http://"+l.Addr().String()+logsPath+"?follow=true", nil)
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	lines := make(chan string, 10)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	time.Sleep(65 * time.Second) // past the server's WriteTimeout (60 s)
	h.call(host, "/say?what=late")
	deadline := time.After(10 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "the stream ended early")
			if strings.Contains(l, "said late") {
				start := time.Now()
				cancel()
				require.NoError(t, <-served)
				require.Less(t, time.Since(start), 5*time.Second, "Serve waited for the open stream")
				return
			}
		case <-deadline:
			t.Fatal("no line")
		}
	}
}

// A worker on a pack that keeps no worker logs (the Cloudflare packs) gets a 501 that says so,
// never an empty log.
func TestWorkerLogOnAPackWithoutLogsIsLogsUnsupportedAndSaysSo(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{
		  "installations": [{"name": "local", "pack": "selfhost"}, {"name": "wfp", "pack": "wfp-managed", "baseDomain": "edge.example.com"}],
		  "offerings": [{"id": "local-worker", "kind": "module-worker", "installation": "local", "soldTo": ["*"]},
		                {"id": "wfp-worker", "kind": "module-worker", "installation": "wfp", "soldTo": ["*"]}]
		}`
	})
	body := workerBody()
	body["offeringId"] = "local-worker"
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", workerToken, body).status)
	// This one is moved to wfp-managed behind the Host's back (that installation derives names only).
	h.exec(`UPDATE workers SET installation = 'wfp', pack = 'wfp-managed'`)
	p := h.do(req{method: http.MethodGet, path: logsPath + "?follow=true", key: h.key}).problem(t, http.StatusNotImplemented, "logs_unsupported")
	require.Contains(t, p["detail"], "wfp-managed backend pack does not offer worker logs")
}
