package leakscan_test

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/leakscan"
)

const canary = "tk-canary-5be0c41d77"

func TestFindSeesTheSecretUnderNestedEncodings(t *testing.T) {
	t.Parallel()
	std := func(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
	url := func(s string) string { return base64.URLEncoding.EncodeToString([]byte(s)) }
	rawStd := func(s string) string { return base64.RawStdEncoding.EncodeToString([]byte(s)) }
	rawURL := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	hx := func(s string) string { return hex.EncodeToString([]byte(s)) }
	upper := func(s string) string { return strings.ToUpper(hex.EncodeToString([]byte(s))) }
	// Private state as a provider might write it: JSON whose []byte value marshals as base64,
	// which the CLI then stores in the state file as base64 again.
	inner, err := json.Marshal(map[string]any{"bindings": map[string][]byte{"API_KEY": []byte(canary)}})
	require.NoError(t, err)
	state := `{"resources":[{"instances":[{"private":"` + std(string(inner)) + `"}]}]}`

	for name, c := range map[string]struct {
		text, chain string
	}{
		"plain":                       {"x " + canary + " y", ""},
		"base64":                      {`"v":"` + std(canary) + `"`, "base64"},
		"base64url":                   {"v=" + url(canary+"??>>"), "base64url"},
		"raw base64":                  {rawStd(canary + "x"), "base64"},
		"raw base64url":               {rawURL(canary + "~~"), "base64url"},
		"hex":                         {hx(canary), "hex"},
		"upper hex":                   {upper(canary), "hex"},
		"base64 of base64":            {std(std(canary)), "base64 > base64"},
		"hex of base64url":            {hx(url(canary)), "hex > base64url"},
		"base64 of hex of base64":     {std(hx(rawStd(canary))), "base64 > hex > base64"},
		"glued to a prefix":           {"abc" + std(canary), "base64"},
		"private state in state file": {state, "base64 > base64"},
	} {
		t.Run(name, func(t *testing.T) {
			chain, found := leakscan.FindString(c.text, canary)
			require.True(t, found, "in %q", c.text)
			// Where a run has no character outside both alphabets, either name is right.
			require.Equal(t, strings.ReplaceAll(c.chain, "base64url", "base64"), strings.ReplaceAll(chain, "base64url", "base64"))
		})
	}
}

func TestFindStopsAtItsDepthAndFindsNothingThatIsNotThere(t *testing.T) {
	t.Parallel()
	enc := canary
	for range 3 {
		enc = base64.StdEncoding.EncodeToString([]byte(enc))
	}
	_, found := leakscan.Find([]byte(enc), canary, 2)
	require.False(t, found, "three layers are beyond a depth of two")
	_, found = leakscan.Find([]byte(enc), canary, 3)
	require.True(t, found)

	other := base64.StdEncoding.EncodeToString([]byte("tk-canary-5be0c41d78")) + " " + hex.EncodeToString([]byte("unrelated text of some length"))
	_, found = leakscan.FindString(other, canary)
	require.False(t, found)
}
