package supervisor

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerlog"
)

// A worker that prints its secret in any of the ways a worker naturally would (as is, inside
// JSON.stringify, a multi-line key line by line, or within one over-long line) never gets it
// into the log or the tail that status messages quote.
func TestWorkerOutputNeverCarriesAValueInAnyForm(t *testing.T) {
	t.Parallel()
	const plain = "tk-canary-31a9"
	const quoted = "tk \"quoted\" canary\tvalue"
	pem := "-----BEGIN KEY-----\nMIIBVwIBADANBgkqhkiG9w0B\nAQEFAASCAUEwggE9AgEAAkEA\n-----END KEY-----"
	var logs bytes.Buffer
	w := &tailWriter{log: slog.New(slog.NewJSONHandler(&logs, nil)), scrub: scrubForms([]string{plain, quoted, pem})}
	for _, out := range []string{
		"token is " + plain + "\n",
		`{"TOKEN":"tk \"quoted\" canary\tvalue"}` + "\n",
		pem + "\n",
		`{"KEY":"` + strings.ReplaceAll(pem, "\n", `\n`) + `"}` + "\n",
		strings.Repeat("x", maxOutputLine) + plain[:5],
		plain[5:] + "\n",
		"an ordinary line\n",
	} {
		_, err := w.Write([]byte(out))
		require.NoError(t, err)
	}
	text := logs.String() + w.Tail()
	for _, secret := range []string{plain, "quoted\" canary", "MIIBVwIBADANBgkqhkiG9w0B", "AQEFAASCAUEwggE9AgEAAkEA", plain[5:]} {
		require.NotContains(t, text, secret)
	}
	require.Contains(t, text, "an ordinary line")
	require.Contains(t, text, "[redacted]")
}

// A worker that encodes its secret before printing it (btoa, base64url, hex, or base64 of the
// secret inside a longer string at any byte alignment) gets nothing of it into the log: no run of
// base64 or hex characters in the output decodes to a piece of the value.
func TestWorkerOutputNeverCarriesAnEncodedValue(t *testing.T) {
	t.Parallel()
	const secret = "tk-Encoded-canary-7f3e?>~" // '?', '>' and '~' put '/' and '+' into its base64
	var logs bytes.Buffer
	w := &tailWriter{log: slog.New(slog.NewJSONHandler(&logs, nil)), scrub: scrubForms([]string{secret})}
	b := []byte(secret)
	var printed []string
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		printed = append(printed, enc.EncodeToString(b))
		for prefix := range 6 {
			for suffix := range 4 {
				around := append(append([]byte(strings.Repeat("P", prefix)), b...), strings.Repeat("S", suffix)...)
				printed = append(printed, enc.EncodeToString(around))
			}
		}
	}
	printed = append(printed, hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)), "0x"+hex.EncodeToString(b)+"ff")
	for _, p := range printed {
		_, err := w.Write([]byte("value: " + p + " end\n"))
		require.NoError(t, err)
	}
	text := logs.String() + w.Tail()
	require.Equal(t, len(printed), strings.Count(logs.String(), "[redacted]"), "every line is logged, with its encoded value redacted")
	require.Empty(t, recoverable(text, secret, 6))
}

// recoverable returns the pieces of at least n bytes of secret that decode from some run of base64
// (either alphabet, any start) or hex characters in text: what a reader of the log could get back.
func recoverable(text, secret string, n int) []string {
	var found []string
	check := func(decoded []byte) {
		for i := 0; i+n <= len(secret); i++ {
			if piece := secret[i : i+n]; bytes.Contains(decoded, []byte(piece)) && !slices.Contains(found, piece) {
				found = append(found, piece)
			}
		}
	}
	runs := func(alphabet string) []string {
		return strings.FieldsFunc(text, func(r rune) bool { return !strings.ContainsRune(alphabet, r) })
	}
	const digits = "0123456789"
	const letters = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	for _, run := range runs(letters + digits + "+/-_") {
		std := strings.NewReplacer("-", "+", "_", "/").Replace(run)
		for start := 0; start < 4 && start < len(std); start++ {
			piece := std[start:]
			if decoded, err := base64.StdEncoding.DecodeString(piece[:len(piece)-len(piece)%4]); err == nil {
				check(decoded)
			}
		}
	}
	for _, run := range runs(digits + "abcdefABCDEF") {
		for start := 0; start < 2 && start < len(run); start++ {
			piece := run[start:]
			if decoded, err := hex.DecodeString(piece[:len(piece)-len(piece)%2]); err == nil {
				check(decoded)
			}
		}
	}
	return found
}

// One worker cannot flood the node's log: its output passes a token bucket (a burst, then a steady
// rate), and what the bucket refuses is dropped and counted in one summary line.
func TestWorkerOutputIsRateLimitedWithOneSummaryOfWhatWasDropped(t *testing.T) {
	t.Parallel()
	logs := &rateLogSink{}
	clock := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var clockMu sync.Mutex
	w := &tailWriter{log: slog.New(slog.NewJSONHandler(logs, nil)), now: func() time.Time {
		clockMu.Lock()
		defer clockMu.Unlock()
		return clock
	}}
	flood := func(n int) {
		for i := range n {
			_, err := fmt.Fprintf(w, "line %d\n", i)
			require.NoError(t, err)
		}
	}
	logged := func() int { return strings.Count(logs.String(), `"msg":"workerd output"`) }

	flood(1000)
	require.Equal(t, OutputLineBurst, logged(), "a burst passes, the rest of the flood is dropped")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "over the rate limit") }, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, 1, strings.Count(logs.String(), "over the rate limit"), "one summary line for the whole run of drops")
	require.Contains(t, logs.String(), `"dropped":800`)

	clockMu.Lock()
	clock = clock.Add(time.Second)
	clockMu.Unlock()
	flood(1000)
	require.Equal(t, OutputLineBurst+OutputLinesPerSecond, logged(), "a second later the steady rate passes again")
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "over the rate limit") == 2 }, 5*time.Second, 10*time.Millisecond)
	require.Contains(t, logs.String(), `"dropped":900`)
	require.Contains(t, w.Tail(), "900 lines dropped")
}

// rateLogSink is a log sink safe for the summary's timer goroutine.
type rateLogSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *rateLogSink) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *rateLogSink) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// BenchmarkScrubbedLine is the cost of one logged line of a worker with ten 32-byte secrets (every
// form of each is searched for).
func BenchmarkScrubbedLine(b *testing.B) {
	values := make([]string, 10)
	for i := range values {
		values[i] = fmt.Sprintf("secret-%02d-%s", i, strings.Repeat("x", 22))
	}
	w := &tailWriter{log: slog.New(slog.DiscardHandler), scrub: scrubForms(values), bucket: &LineBudget{}}
	line := []byte(strings.Repeat("an ordinary log line of a worker ", 6) + "\n")
	for b.Loop() {
		w.bucket.b = lineBucket{} // measure the scrub, not the rate limit
		_, _ = w.Write(line)
	}
	b.ReportMetric(float64(len(w.scrub)), "forms")
}

// The budget is the tenant's: a process that restarts (a crash on purpose) gets no fresh burst,
// and two incarnations of one tenant share one burst.
func TestOutputRateLimitIsTheTenantsAcrossRestartsAndIncarnations(t *testing.T) {
	t.Parallel()
	var budget LineBudget
	clock := time.Unix(1_700_000_000, 0)
	admitted := 0
	for range 3 { // two starts of one incarnation and one of another, at the same instant
		w := &tailWriter{log: slog.New(slog.DiscardHandler), bucket: &budget, now: func() time.Time { return clock }}
		for range OutputLineBurst {
			if w.admit() {
				admitted++
			}
		}
		if w.report != nil {
			w.report.Stop()
		}
	}
	if admitted != OutputLineBurst {
		t.Fatalf("%d lines admitted over three writers of one tenant, want one burst of %d", admitted, OutputLineBurst)
	}
}

// A worker's console lines reach its log ring decoded from workerd's structured output and
// scrubbed first: a value printed as is, inside JSON.stringify, base64 or hex never enters the
// ring, and workerd's own lines (not the worker's) do not enter it at all.
func TestWorkerLogRingGetsOnlyScrubbedWorkerLines(t *testing.T) {
	t.Parallel()
	const secret = "tk \"quoted\" canary\tvalue"
	ring := workerlog.New()
	defer ring.Close()
	var logs bytes.Buffer
	w := &tailWriter{log: slog.New(slog.NewJSONHandler(&logs, nil)), scrub: scrubForms([]string{secret}), ring: ring, incarnation: "inc-1"}
	structured := func(level, message string, source ...string) string {
		fields := map[string]any{"timestamp": 1, "level": level, "message": message}
		if len(source) > 0 {
			fields["source"] = source[0]
		}
		b, err := json.Marshal(fields)
		require.NoError(t, err)
		return string(b) + "\n"
	}
	envJSON, err := json.Marshal(map[string]string{"KEY": secret})
	require.NoError(t, err)
	for _, out := range []string{
		structured("log", "raw "+secret),
		structured("error", "env "+string(envJSON)),
		structured("warn", "b64 "+base64.StdEncoding.EncodeToString([]byte(secret))),
		structured("info", "hex "+hex.EncodeToString([]byte(secret))),
		structured("info", "workerd internals", "workerd/server/server.c++:1"),
		"unstructured output\n",
	} {
		_, err := w.Write([]byte(out))
		require.NoError(t, err)
	}
	page, _ := ring.Read("", 0, time.Time{}, 0)
	var got []string
	for _, e := range page.Entries {
		require.Equal(t, "inc-1", e.Incarnation)
		got = append(got, e.Level+" "+e.Message)
	}
	require.Equal(t, []string{"log raw [redacted]", `error env {"KEY":"[redacted]"}`, "warn b64 [redacted]", "info hex [redacted]"}, got)
	require.Empty(t, recoverable(strings.Join(got, "\n")+logs.String(), secret, 6))
	require.Contains(t, logs.String(), "workerd internals", "workerd's own lines still reach the node's log")
}

// BenchmarkStructuredLineIntoTheRing is the cost of one console line of a worker with ten 32-byte
// secrets: decoded, scrubbed, logged and appended to its ring.
func BenchmarkStructuredLineIntoTheRing(b *testing.B) {
	values := make([]string, 10)
	for i := range values {
		values[i] = fmt.Sprintf("secret-%02d-%s", i, strings.Repeat("x", 22))
	}
	clock := time.Unix(1_700_000_000, 0)
	ring := workerlog.NewWithClock(func() time.Time { clock = clock.Add(time.Second); return clock }) // a fresh token per line
	defer ring.Close()
	w := &tailWriter{log: slog.New(slog.DiscardHandler), scrub: scrubForms(values), bucket: &LineBudget{}, ring: ring, incarnation: "inc-1"}
	line := []byte(`{"timestamp":1,"level":"log","message":"` + strings.Repeat("an ordinary log line of a worker ", 6) + `"}` + "\n")
	for b.Loop() {
		w.bucket.b = lineBucket{} // measure the line, not the node log's rate limit
		_, _ = w.Write(line)
	}
}
