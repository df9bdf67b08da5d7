package cloudflare

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAnUploadCarriesServiceBindingsAndItsCPULimit(t *testing.T) {
	u := Upload{MainModule: "index.js", CompatibilityDate: "2025-01-01", Services: map[string]string{"AUTH": "auth-prod-0123"}, CPUMs: 50}
	raw, err := json.Marshal(u.ScriptParams("acc").Metadata.Value)
	require.NoError(t, err)
	var m struct {
		Bindings []map[string]any `json:"bindings"`
		Limits   map[string]any   `json:"limits"`
	}
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Contains(t, m.Bindings, map[string]any{"name": "AUTH", "type": "service", "service": "auth-prod-0123"})
	require.Equal(t, map[string]any{"cpu_ms": float64(50)}, m.Limits)

	raw, err = json.Marshal(Upload{MainModule: "index.js"}.ScriptParams("acc").Metadata.Value)
	require.NoError(t, err)
	require.NotContains(t, string(raw), "limits", "no limit: Cloudflare's default")
}

func TestADispatchUploadCarriesEntrypointBindingsWithTheirProps(t *testing.T) {
	u := Upload{MainModule: "index.js", CompatibilityDate: "2025-01-01", PlainText: map[string]string{"A": "b"},
		Entrypoints: map[string]EntrypointBinding{"AUTH": {Service: "takoform-dispatch", Entrypoint: "Binding", Props: map[string]string{"calleeScript": "tsw-x", "calleeUid": "u-1"}}}}
	raw, err := json.Marshal(u.DispatchScriptParams("acc").Metadata.Value)
	require.NoError(t, err)
	var m struct {
		Bindings []map[string]any `json:"bindings"`
	}
	require.NoError(t, json.Unmarshal(raw, &m))
	require.Contains(t, m.Bindings, map[string]any{"name": "A", "type": "plain_text", "text": "b"}, "the SDK's own bindings are kept")
	require.Contains(t, m.Bindings, map[string]any{"name": "AUTH", "type": "service", "service": "takoform-dispatch", "entrypoint": "Binding",
		"props": map[string]any{"calleeScript": "tsw-x", "calleeUid": "u-1"}})
}
