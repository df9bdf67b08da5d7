package workerd_test

import (
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	. "github.com/takoform/terraform-provider-takoform/internal/runtime/workerd"
	"github.com/takoform/terraform-provider-takoform/internal/runtime/workerd/workerdtest"
)

func orgFiles(t *testing.T, o Org) (string, map[string][]byte) {
	t.Helper()
	files, err := o.Files()
	require.NoError(t, err)
	return string(files[ConfigFile]), files
}

// An org process's config holds the runtime's router and sockets only: no tenant's code, variable
// or secret is ever in a file workerd reads (SPEC 5).
func TestAnOrgProcessConfigHoldsOnlyTheRouterAndItsSockets(t *testing.T) {
	t.Parallel()
	config, files := orgFiles(t, Org{SocketDir: "/sockets", ProbeEntrypoint: "takoformProbe_0123abcd", HeapLimitMB: 128})
	require.Len(t, files, 2, "the config and the router, nothing of a tenant's")
	require.Contains(t, string(files[RouterFile]), "env.LOADER.get(", "the router loads isolates through the Worker Loader")
	for _, want := range []string{
		`(name = "LOADER", workerLoader = ())`,
		`address = "unix:/sockets/code.sock"`, `address = "unix:/sockets/egress.sock"`,
		`address = "unix:/sockets/bindings.sock"`, `address = "unix:/sockets/tails.sock"`,
		`style = proxy`, `"--initial-old-space-size=8"`, `"--max-old-space-size=128"`, `"--no-concurrent-recompilation"`, `text = "takoformProbe_0123abcd"`,
		`globalOutbound = "nowhere"`, `network = (allow = [])`,
	} {
		require.Contains(t, config, want)
	}
	require.Contains(t, ServeArgs(), "--experimental", "the pinned workerd refuses a loader without it")

	config, _ = orgFiles(t, Org{ProbeEntrypoint: "takoformProbe_0123abcd", HeapLimitMB: 64})
	require.Contains(t, config, `address = "unix:code.sock"`, "without a sandbox, the sockets are in its working directory")

	_, err := Org{ProbeEntrypoint: "probe", HeapLimitMB: 128}.Files()
	require.Error(t, err, "a probe entrypoint a module could guess")
}

// Every isolate the router loads gets its globalOutbound, tail and service bindings from the router
// itself, stamped with its loader id: an omitted globalOutbound would inherit the router's network.
func TestTheRouterNeverOmitsAnIsolatesOutboundAndStripsOurHeaders(t *testing.T) {
	t.Parallel()
	_, files := orgFiles(t, Org{ProbeEntrypoint: "takoformProbe_0123abcd", HeapLimitMB: 128})
	router := string(files[RouterFile])
	require.Contains(t, router, "globalOutbound: ctx.exports.Egress({ props: { loader: id } })")
	require.Contains(t, router, "tails: [ctx.exports.Tail({ props: { loader: id } })]")
	require.NotContains(t, router, "allowExperimental", "a tenant's isolate never gets experimental features")
	require.Contains(t, router, `name.startsWith("takoform-")`)
}

// The pinned workerd has the Worker Loader only behind --experimental: the day a new pin drops it
// (or no longer needs the flag), this fails before any node does. With it, the router serves.
func TestThePinnedWorkerdLoadsIsolatesOnlyWithExperimental(t *testing.T) {
	t.Parallel()
	bin := workerdtest.Binary(t)
	dir := t.TempDir()
	_, files := orgFiles(t, Org{ProbeEntrypoint: "takoformProbe_0123abcd", HeapLimitMB: 128})
	for name, data := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o600))
	}
	serve := func(experimental bool) (*exec.Cmd, string, *strings.Builder) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := l.Addr().String()
		require.NoError(t, l.Close())
		args := ServeArgs()
		if !experimental {
			args = slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--experimental" })
		}
		cmd := exec.Command(bin, append(args, "--socket-addr", IngressSocket+"="+addr)...)
		cmd.Dir = dir
		out := &strings.Builder{}
		cmd.Stdout, cmd.Stderr = out, out
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		return cmd, addr, out
	}
	cmd, _, out := serve(false)
	require.Error(t, cmd.Wait(), "the loader without --experimental")
	require.Contains(t, out.String(), "--experimental")

	_, addr, _ := serve(true)
	require.Eventually(t, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/", nil)
		req.Header.Set(HeaderLiveness, "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b) == "alive"
	}, 10*time.Second, 20*time.Millisecond, "the router answers its liveness probe")
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

func TestModuleTypes(t *testing.T) {
	t.Parallel()
	require.Equal(t, "js", ModuleType("index.js"))
	require.Equal(t, "js", ModuleType("lib/x.mjs"))
	require.Equal(t, "json", ModuleType("data.json"))
	require.Equal(t, "text", ModuleType("a.txt"))
}

func TestQuote(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"a\"b\\c\x0a"`, Quote("a\"b\\c\n"))
	require.True(t, strings.HasPrefix(Quote("é"), `"é`))
}
