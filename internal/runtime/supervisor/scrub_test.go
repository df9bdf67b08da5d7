package supervisor

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
