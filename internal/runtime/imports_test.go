package runtime_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheRuntimeImportsNothingOfTheHost: "the runtime node is its own package tree ... that imports
// nothing of the Host's domain or store; the two share only the admin API's wire types" (SPEC 5).
// Every package the runtime's code depends on is of the runtime's own tree or one of the few
// leaves that know nothing of the Host (canonical JSON, private directories, a worker's settings).
func TestTheRuntimeImportsNothingOfTheHost(t *testing.T) {
	t.Parallel()
	const module = "github.com/takoform/terraform-provider-takoform/"
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}", "./...").CombinedOutput()
	require.NoError(t, err, string(out))
	// workerconf is a worker's plain settings: part of the admin API's wire types, with no Host in
	// it; vocab is the shapes of names and the Secret type, shared with the Host; netlisten opens
	// a listener, waiting out a busy address.
	leaves := map[string]bool{module + "internal/canonjson": true, module + "internal/safedir": true,
		module + "internal/workerconf": true, module + "internal/vocab": true, module + "internal/netlisten": true, module + "internal/poolkey": true}
	var own, foreign []string
	for _, pkg := range strings.Fields(string(out)) {
		switch {
		case !strings.HasPrefix(pkg, module):
		case strings.HasPrefix(pkg, module+"internal/runtime/") || pkg == module+"internal/runtime":
			own = append(own, pkg)
		case !leaves[pkg]:
			foreign = append(foreign, pkg)
		}
	}
	require.Contains(t, own, module+"internal/runtime/orgproc", "the listing covers the runtime's tree")
	require.Empty(t, foreign, "the runtime node depends on packages of the Host")
}
