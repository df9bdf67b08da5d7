package workerd

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRenderKeepsSourcesAndSecretsOutOfTheConfig(t *testing.T) {
	t.Parallel()
	files, err := Render(Worker{
		Modules:           map[string]string{"lib/util.js": "export const x = 1;", "main.js": `import {x} from "lib/util.js"; export default {}`, "data.json": `{"a":1}`},
		MainModule:        "main.js",
		CompatibilityDate: "2024-09-23",
		Secrets:           []string{"TOKEN", "API_KEY"},
	}, "config.capnp", "config", "http")
	require.NoError(t, err)
	config := string(files["config.capnp"])
	require.Contains(t, config, `(name = "main.js", esModule = embed "module-000.js")`, "the main module comes first")
	require.Contains(t, config, `(name = "data.json", json = embed "module-001.json")`)
	require.Contains(t, config, `(name = "API_KEY", fromEnvironment = "TAKOFORM_SECRET_API_KEY")`)
	require.NotContains(t, config, "export", "sources are embedded from files, never quoted")
	require.Equal(t, "export const x = 1;", string(files["module-002.js"]))
}

func TestValidateRefusesWhatCannotRun(t *testing.T) {
	t.Parallel()
	ok := Worker{Modules: map[string]string{"main.js": ""}, MainModule: "main.js", CompatibilityDate: "2024-09-23"}
	require.NoError(t, ok.Validate())
	for name, mutate := range map[string]func(w *Worker){
		"no modules":       func(w *Worker) { w.Modules = nil },
		"main not present": func(w *Worker) { w.MainModule = "other.js" },
		"bad date":         func(w *Worker) { w.CompatibilityDate = "2024-9-23\"" },
		"bad binding":      func(w *Worker) { w.Secrets = []string{"A-B"} },
		"control in name":  func(w *Worker) { w.Modules = map[string]string{"main.js": "", "a\nb": ""} },
	} {
		w := ok
		w.Modules = map[string]string{"main.js": ""}
		mutate(&w)
		require.Error(t, w.Validate(), name)
	}
}

func TestQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"a\"b\\c\x0a"`, quote("a\"b\\c\n"))
	require.True(t, strings.HasPrefix(quote("é"), `"é`))
}
