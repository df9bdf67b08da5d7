package scrub

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A worker that prints its secret in any of the ways a worker naturally would (as is, inside
// JSON.stringify, a multi-line key line by line) never gets it past the scrubber.
func TestAValueIsRemovedInEveryFormAWorkerPrintsItIn(t *testing.T) {
	t.Parallel()
	const plain = "tk-canary-31a9"
	const quoted = "tk \"quoted\" canary\tvalue"
	pem := "-----BEGIN KEY-----\nMIIBVwIBADANBgkqhkiG9w0B\nAQEFAASCAUEwggE9AgEAAkEA\n-----END KEY-----"
	s := New([]string{plain, quoted, pem})
	envJSON, err := json.Marshal(map[string]string{"TOKEN": quoted, "KEY": pem})
	require.NoError(t, err)
	var out []string
	for _, line := range []string{
		"token is " + plain,
		string(envJSON),
		pem,
		strings.Split(pem, "\n")[1],
		"an ordinary line",
	} {
		out = append(out, s.Apply(line))
	}
	text := strings.Join(out, "\n")
	for _, secret := range []string{plain, "quoted\" canary", `quoted\" canary`, "MIIBVwIBADANBgkqhkiG9w0B", "AQEFAASCAUEwggE9AgEAAkEA"} {
		require.NotContains(t, text, secret)
	}
	require.Contains(t, text, "an ordinary line")
	require.Contains(t, text, Redacted)
	require.Equal(t, "nothing to hide", Scrubber{}.Apply("nothing to hide"), "the zero scrubber removes nothing")
}

// A worker that encodes its secret before printing it (btoa, base64url, hex, or base64 of the
// secret inside a longer string at any byte alignment) gets nothing of it past the scrubber: no
// run of base64 or hex characters left decodes to a piece of the value.
func TestAnEncodedValueIsRemovedAtEveryAlignment(t *testing.T) {
	t.Parallel()
	const secret = "tk-Encoded-canary-7f3e?>~" // '?', '>' and '~' put '/' and '+' into its base64
	s := New([]string{secret})
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
	var out []string
	for _, p := range printed {
		line := s.Apply("value: " + p + " end")
		require.Contains(t, line, Redacted, p)
		out = append(out, line)
	}
	require.Empty(t, recoverable(strings.Join(out, "\n"), secret, 6))
}

// Merge removes what either scrubber removes.
func TestMergedScrubbersRemoveBothValues(t *testing.T) {
	t.Parallel()
	a, b := New([]string{"first-canary-1"}), New([]string{"second-canary-2"})
	merged := a.Merge(b)
	require.Equal(t, fmt.Sprintf("%s and %s", Redacted, Redacted), merged.Apply("first-canary-1 and second-canary-2"))
	require.Equal(t, a.Len()+b.Len(), merged.Len())
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

// A worker that prints its secret inside JSON.stringify's output, or percent-encoded by
// encodeURIComponent, URLSearchParams or encodeURI, gets none of it past the scrubber. The
// expected forms were written by node (v20) from the same value; Go's own JSON encoder escapes
// <, > and & where JSON.stringify does not.
func TestAValueIsRemovedAsJavaScriptEncodesIt(t *testing.T) {
	t.Parallel()
	const value = "p\"<w>&d s/é+~*\u2028"
	s := New([]string{value})
	for name, printed := range map[string]string{
		"JSON.stringify":     `{"TOKEN":"p\"<w>&d s/é+~*` + "\u2028" + `"}`,
		"encodeURIComponent": "https://api.example/?t=p%22%3Cw%3E%26d%20s%2F%C3%A9%2B~*%E2%80%A8&x=1",
		"URLSearchParams":    "t=p%22%3Cw%3E%26d+s%2F%C3%A9%2B%7E*%E2%80%A8&x=1",
		"encodeURI":          "https://api.example/p%22%3Cw%3E&d%20s/%C3%A9+~*%E2%80%A8",
		"lower-case escapes": "t=p%22%3cw%3e%26d+s%2f%c3%a9%2b%7e*%e2%80%a8",
	} {
		out := s.Apply(printed)
		require.Contains(t, out, Redacted, "%s: %s", name, out)
		for _, piece := range []string{"<w>", "%3Cw%3E", "%3cw%3e", "s%2F%C3%A9", "s%2f%c3%a9"} {
			require.NotContains(t, out, piece, "%s kept a piece of the value: %s", name, out)
		}
	}
}
