package server_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestServerIsHTTPAndTheDomainIsNot: server/ turns HTTP into domain calls and answers into HTTP,
// and holds no SQL of its own (no generated queries); the domain packages it calls know nothing
// of HTTP (no net/http, no echo): a status is the ownership ledger's, from the domain's "created".
func TestServerIsHTTPAndTheDomainIsNot(t *testing.T) {
	t.Parallel()
	const module = "github.com/takoform/terraform-provider-takoform/"
	imports := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, module+pkg).CombinedOutput()
		require.NoError(t, err, string(out))
		return strings.Fields(string(out))
	}
	require.Contains(t, imports("server"), "github.com/labstack/echo/v4", "the listing reads server's imports")
	require.NotContains(t, imports("server"), module+"internal/store/dbsqlc", "server/ runs queries itself")
	for _, domain := range []string{"internal/resource", "internal/reservation", "internal/runtimeinput"} {
		for _, pkg := range imports(domain) {
			require.False(t, pkg == "net/http" || strings.HasPrefix(pkg, "github.com/labstack/"), "%s imports %s", domain, pkg)
		}
	}
}
