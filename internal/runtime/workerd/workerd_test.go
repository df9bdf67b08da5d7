package workerd

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/workerconf"
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
	require.Equal(t, `"a\"b\\c\x0a"`, Quote("a\"b\\c\n"))
	require.True(t, strings.HasPrefix(Quote("é"), `"é`))
}

func TestEveryConfigNamesItsOutboundNetworkAndProbe(t *testing.T) {
	t.Parallel()
	files, err := Render(Worker{
		Modules: map[string]string{"main.js": "export default {}"}, MainModule: "main.js", CompatibilityDate: "2024-09-23",
		Deny: []string{"192.0.2.2/32", "fd00::2/128", "203.0.113.0/24", "192.0.2.2/32"},
	}, "config.capnp", "config", "http")
	require.NoError(t, err)
	config := string(files["config.capnp"])
	require.Contains(t, config, `allow = ["public"],`)
	require.Contains(t, config, `deny = ["192.0.2.2/32", "198.18.0.0/15", "203.0.113.0/24", "64:ff9b:1::/48", "64:ff9b::/96", "fd00::2/128"],`,
		"the node's addresses, the fixed ranges and the operator's, once each, sorted")
	require.Contains(t, config, `tlsOptions = (trustBrowserCas = true)`)
	require.Contains(t, config, `globalOutbound = "egress"`, "the user's worker reaches the network only through the egress proxy")
	require.Contains(t, config, `(name = "outbound", service = "dialer", http = (style = proxy))`)
	require.Contains(t, config, `(name = "probe", service = "dialer", http = (injectRequestHeaders = [(name = "Takoform-Probe-Socket", value = "1")]))`)
	require.Equal(t, 2, strings.Count(config, "Workerd.Worker = ("), "the user's worker and one of the runtime's, no more isolates")
	require.Equal(t, 1, strings.Count(config, `network = (`), "one network service, the one with the deny list")
	// A public address is allowed: "public" admits it and no deny entry covers it.
	for _, public := range []string{"8.8.8.8", "1.1.1.1", "2606:4700::1111"} {
		require.NotContains(t, config, public)
	}
	require.Contains(t, string(files["takoform-dialer.js"]), ProbeReply)

	_, err = Render(Worker{Modules: map[string]string{"main.js": ""}, MainModule: "main.js", CompatibilityDate: "2024-09-23",
		Deny: []string{`1.2.3.4/32"], allow = ["private`}}, "config.capnp", "config", "http")
	require.Error(t, err, "a deny entry is a CIDR, nothing else")
}

func TestRenderWritesVarsAndFlagsIntoTheConfig(t *testing.T) {
	w := Worker{Modules: map[string]string{"index.js": "export default {}"}, MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Secrets: []string{"API_KEY"}, Settings: workerconf.Settings{
			Vars: map[string]string{"LOG_LEVEL": `say "hi"`}, JSONVars: map[string]string{"LIMITS": `{"rps":5}`},
			CompatibilityFlags: []string{"nodejs_compat"},
		}}
	files, err := Render(w, "config.capnp", "config", "http")
	require.NoError(t, err)
	config := string(files["config.capnp"])
	require.Contains(t, config, `(name = "LOG_LEVEL", text = "say \"hi\""),`)
	require.Contains(t, config, `(name = "LIMITS", json = "{\"rps\":5}"),`)
	require.Contains(t, config, `compatibilityFlags = ["nodejs_compat"],`)
	require.Contains(t, config, `v8Flags = ["--max-semi-space-size=1"],`, "the young generation is kept small")
	require.Contains(t, config, `(name = "API_KEY", fromEnvironment = "TAKOFORM_SECRET_API_KEY"),`)

	// A var may not take a secret's name: one binding, one kind.
	w.Settings.Vars["API_KEY"] = "plain"
	_, err = Render(w, "config.capnp", "config", "http")
	require.ErrorContains(t, err, "required sensitive var")
}

func TestAServiceBindingIsAnExternalServiceNamingNoCallee(t *testing.T) {
	const callee = "0b9c6f1e-2f53-4d8e-9a3c-3f0f7a1b2c3d"
	w := Worker{Modules: map[string]string{"index.js": "export default {}"}, MainModule: "index.js", CompatibilityDate: "2025-01-01",
		Settings: workerconf.Settings{ServiceBindings: map[string]string{"AUTH": callee}}}
	files, err := Render(w, "config.capnp", "config", "http")
	require.NoError(t, err)
	config := string(files["config.capnp"])
	require.Contains(t, config, `(name = "takoform-binding-AUTH", external = (http = ())),`)
	require.Contains(t, config, `(name = "AUTH", service = "takoform-binding-AUTH"),`)
	require.NotContains(t, config, callee, "the node routes by the callee's UID; the config does not name it")

	// Another callee under the same name renders the same config: the caller is not restarted.
	w.Settings.ServiceBindings["AUTH"] = "1b9c6f1e-2f53-4d8e-9a3c-3f0f7a1b2c3d"
	again, err := Render(w, "config.capnp", "config", "http")
	require.NoError(t, err)
	require.Equal(t, files["config.capnp"], again["config.capnp"])
}
