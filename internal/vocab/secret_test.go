package vocab_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

func TestSecretRedactsItselfEverywhere(t *testing.T) {
	t.Parallel()
	const canary = "canary-4f1d2a9c7e"
	s := vocab.NewSecret(canary)
	type holder struct {
		Value vocab.Secret
		Ptr   *vocab.Secret
		Map   map[string]vocab.Secret
	}
	h := holder{Value: s, Ptr: &s, Map: map[string]vocab.Secret{"TOKEN": s}}
	var out []string
	for _, f := range []string{"%v", "%s", "%+v", "%#v", "%q", "%x", "%d"} {
		out = append(out, fmt.Sprintf(f, s), fmt.Sprintf(f, h))
	}
	out = append(out, fmt.Sprint(s), fmt.Sprintln(h), s.String(), s.GoString())
	raw, err := json.Marshal(h)
	require.NoError(t, err)
	out = append(out, string(raw))
	text, err := s.MarshalText()
	require.NoError(t, err)
	out = append(out, string(text))
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("x", "secret", s, "holder", h)
	slog.New(slog.NewTextHandler(&logs, nil)).Info("x", "secret", s, "map", h.Map)
	out = append(out, logs.String())
	for _, o := range out {
		require.NotContains(t, o, canary)
		require.NotContains(t, o, "4f1d2a9c7e")
	}
	require.Contains(t, fmt.Sprint(h.Map), "TOKEN", "names are not secret and help debugging")
	require.Equal(t, canary, s.Reveal())

	var decoded struct{ V vocab.Secret }
	require.NoError(t, json.Unmarshal([]byte(`{"V":"`+canary+`"}`), &decoded))
	require.Equal(t, canary, decoded.V.Reveal())
	require.ErrorContains(t, json.Unmarshal([]byte(`{"V":1}`), &decoded), "must be a JSON string")
}
