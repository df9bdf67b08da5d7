package adminapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

func TestSecretNeverPrints(t *testing.T) {
	t.Parallel()
	const canary = "canary-7f3a9c"
	put := SecretsPut{EffectID: "e1", WorkerUID: "w1", DeliveryID: "d1", Values: map[string]vocab.Secret{"TOKEN": vocab.NewSecret(canary)}}
	var logs bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&logs, nil))
	log.Info("delivery", "put", put, "value", put.Values["TOKEN"], "values", put.Values)
	printed := fmt.Sprintf("%v %+v %#v %s %q %v %#v", put, put, put, put, put, put.Values, put.Values)
	asJSON, err := json.Marshal(put.Values)
	require.NoError(t, err)
	for _, out := range []string{logs.String(), printed, string(asJSON)} {
		require.NotContains(t, out, canary)
	}
	require.Contains(t, printed, "TOKEN", "names are not secret and help debugging")

	wire, err := json.Marshal(put)
	require.NoError(t, err)
	require.Contains(t, string(wire), canary, "the request body is where the value travels")
	var back SecretsPut
	require.NoError(t, json.Unmarshal(wire, &back))
	require.Equal(t, canary, back.Values["TOKEN"].Reveal())
}

func TestBrakeScope(t *testing.T) {
	t.Parallel()
	l := Labels{Organization: "o", Space: "s", Worker: "w"}
	require.True(t, BrakeScope{}.Matches(l))
	require.True(t, BrakeScope{Organization: "o"}.Matches(l))
	require.False(t, BrakeScope{Organization: "p"}.Matches(l))
	require.True(t, BrakeScope{Organization: "o", Space: "s", Worker: "w"}.Matches(l))
	require.False(t, BrakeScope{Organization: "o", Space: "s", Worker: "x"}.Matches(l))
	require.True(t, BrakeScope{}.Valid())
	require.True(t, BrakeScope{Organization: "o"}.Valid())
	require.False(t, BrakeScope{Space: "s", Worker: "w"}.Valid())
	require.False(t, BrakeScope{Organization: "o", Space: "s"}.Valid())
}
