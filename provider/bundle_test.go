package provider_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/testhost"
)

// logsHolding is the worker's log as the Host's log route answers it, once it holds want (within
// 20 s, else the test fails).
func logsHolding(t *testing.T, h *testhost.Host, space, name, want string) string {
	t.Helper()
	var logs string
	require.Eventually(t, func() bool {
		req, err := http.NewRequest(http.MethodGet, h.URL+"/v1/spaces/"+space+"/workers/"+name+"/logs", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+h.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		logs = string(b)
		return strings.Contains(logs, want)
	}, 20*time.Second, 100*time.Millisecond, "the worker's log never held %q", want)
	return logs
}

// fileWorker is one worker through examples/modules/worker whose bundle comes from files beside the
// configuration.
func fileWorker(t *testing.T) string {
	t.Helper()
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

module "w" {
  source       = %q
  space        = "files"
  name         = "big"
  module_files = { "index.js" = "${path.module}/src/index.js", "pad.txt" = "${path.module}/src/pad.txt" }
}

output "url" {
  value = module.w.url
}
`, module)
}

// A bundle from module_files is shown in the plan by path, digest and size, never in full (issue
// 13.5); a changed file plans an update in place by its digest alone, and a file changed between
// plan and apply fails the apply (the CLI's own re-plan meets the digest that moved) instead of
// deploying what nobody saw planned.
func TestAccModuleFilesShowDigestsNotSources(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	w := newWorkspace(t, h.URL, h.Key, fileWorker(t))
	src := filepath.Join(w.dir, "src")
	require.NoError(t, os.Mkdir(src, 0o700))
	// The pad is a text module, large enough that a plan printing it would print a great deal.
	const marker = "PADDING-THE-PLAN-MUST-NOT-PRINT"
	pad := strings.Repeat(marker+"\n", 20000)
	require.NoError(t, os.WriteFile(filepath.Join(src, "pad.txt"), []byte(pad), 0o600))
	code := func(reply string) string {
		return "import pad from './pad.txt';\nexport default { fetch() { return new Response('" + reply + " ' + pad.length) } };\n"
	}
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(code("one")), 0o600))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)

	out, err = w.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.NotContains(t, out, marker, "the plan prints no source from module_files")
	sum := sha256.Sum256([]byte(pad))
	require.Contains(t, out, hex.EncodeToString(sum[:]), "the plan shows each module's digest")
	require.Regexp(t, fmt.Sprintf(`bundle_bytes\s+= %d\n`, len("index.js")+len(code("one"))+len("pad.txt")+len(pad)), out)

	out = w.apply(fileWorker(t))
	require.NotContains(t, out, marker)
	answersAt(t, w, h, fmt.Sprintf("one %d", len(pad)))
	// The refreshes read digests, not the 600 KB of sources: every read of the worker answered
	// a few KB.
	reads := 0
	for _, line := range strings.Split(h.Logs(), "\n") {
		if strings.Contains(line, `"method":"GET","route":"/v1/spaces/:space/workers/:name"`) {
			reads++
			var entry struct {
				Bytes int64 `json:"bytes"`
			}
			require.NoError(t, json.Unmarshal([]byte(line), &entry))
			require.Less(t, entry.Bytes, int64(len(pad)/10), "a refresh from files reads digests: %s", line)
		}
	}
	require.Positive(t, reads, "the re-plan refreshed the worker")

	// Only the file changes: the configuration is the same text, the digest says what moved.
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(code("two")), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.Error(t, err, "a changed module file plans an update:\n%s", out)
	require.Contains(t, out, "module.w.takoform_worker.this will be updated in-place")
	require.Contains(t, out, `"index.js" = "`, "the changed module is named by its digest")
	require.NotContains(t, out, marker)

	// A file that changes after the plan fails the saved plan's apply; nothing is deployed.
	out, err = w.run("plan", "-input=false", "-no-color", "-out=tfplan")
	require.NoError(t, err, out)
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(code("three")), 0o600))
	out, err = w.run("apply", "-input=false", "-no-color", "tfplan")
	require.Error(t, err, out)
	// The CLI plans again at apply and refuses the digest that moved, naming it.
	require.Regexp(t, `(?s)inconsistent final plan.*module_sha256\["index.js"\]`, out)
	answersAt(t, w, h, fmt.Sprintf("one %d", len(pad)))

	w.apply(fileWorker(t))
	answersAt(t, w, h, fmt.Sprintf("three %d", len(pad)))

	// Imported into the same configuration (issue 32 item 4): the Host kept the paths, so the
	// import plans no change and prints no source. -generate-config-out writes the paths too.
	out, err = w.run("state", "rm", "module.w.takoform_worker.this")
	require.NoError(t, err, out)
	importing := fileWorker(t) + `
import {
  to = module.w.takoform_worker.this
  id = "files/big"
}
`
	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(importing), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Contains(t, out, "1 to import, 0 to add, 0 to change, 0 to destroy", "the import plans no change:\n%s", out)
	require.NotContains(t, out, marker)
	generating := importing + `
import {
  to = takoform_worker.generated
  id = "files/big"
}
`
	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(generating), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color", "-generate-config-out=generated.tf")
	require.NoError(t, err, out)
	require.NotContains(t, out, marker)
	generated, err := os.ReadFile(filepath.Join(w.dir, "generated.tf"))
	require.NoError(t, err)
	require.Contains(t, string(generated), "./src/pad.txt", "the generated configuration names the files")
	require.NotContains(t, string(generated), marker, "and holds no source")
	require.NoError(t, os.Remove(filepath.Join(w.dir, "generated.tf")))
	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(importing), 0o600))
	out, err = w.run("apply", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.NotContains(t, out, marker)
	out, err = w.run("plan", "-input=false", "-no-color", "-detailed-exitcode")
	require.NoError(t, err, "re-plan after the import is empty:\n%s", out)

	out, err = w.run("destroy", "-auto-approve", "-input=false", "-no-color")
	require.NoError(t, err, out)
}

// wasmWorker is one worker through examples/modules/worker whose bundle holds a WebAssembly and a
// data module from files.
func wasmWorker(t *testing.T) string {
	t.Helper()
	module, err := filepath.Abs("../examples/modules/worker")
	require.NoError(t, err)
	return fmt.Sprintf(`
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

module "w" {
  source       = %q
  space        = "files"
  name         = "wasm"
  module_files = {
    "index.js" = "${path.module}/src/index.js"
    "add.wasm" = "${path.module}/src/add.wasm"
    "blob.bin" = "${path.module}/src/blob.bin"
  }
}

output "url" {
  value = module.w.url
}
`, module)
}

// A bundle with a WebAssembly module and a data module (SPEC 3.6, issue 33): module_files reads
// them as bytes, module_sha256 is filesha256() of each (bytes, not base64), and the worker that
// imports them answers through the edge with what it computed from them. A main module that is
// not code fails at plan, named.
func TestAccWebAssemblyAndDataModulesDeployFromFiles(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	w := newWorkspace(t, h.URL, h.Key, wasmWorker(t))
	src := filepath.Join(w.dir, "src")
	require.NoError(t, os.Mkdir(src, 0o700))
	// testdata/add.wat compiled: add(i32, i32) i32.
	wasm, err := hex.DecodeString("0061736d0100000001070160027f7f017f030201000707010361646400000a09010700200020016a0b")
	require.NoError(t, err)
	blob := []byte{0, 1, 2, 255}
	require.NoError(t, os.WriteFile(filepath.Join(src, "add.wasm"), wasm, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "blob.bin"), blob, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(`import add from "./add.wasm";
import blob from "./blob.bin";
const instance = new WebAssembly.Instance(add);
export default { fetch() {
  const bytes = new Uint8Array(blob);
  return new Response("add=" + instance.exports.add(40, 2) + " blob=" + bytes.length + ":" + bytes[0] + "," + bytes[bytes.length - 1]);
} };
`), 0o600))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	out, err = w.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	sum := sha256.Sum256(wasm)
	require.Contains(t, out, `"add.wasm" = "`+hex.EncodeToString(sum[:])+`"`, "module_sha256 of a wasm file is filesha256()")

	w.apply(wasmWorker(t))
	answersAt(t, w, h, "add=42 blob=4:0,255")

	notCode := strings.Replace(wasmWorker(t), `source       =`, `main_module  = "add.wasm"
  source       =`, 1)
	require.NoError(t, os.WriteFile(filepath.Join(w.dir, "main.tf"), []byte(notCode), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "main_module is not code")
}

// A bundle from module_files may reach its offering's maxBundleBytes (10 MiB by default), far past
// the 1 MiB of a request the provider sends plain: it travels gzip-compressed, and the worker
// serves it. Past the ceiling it fails at plan, naming the ceiling.
func TestAccALargeBundleFromFilesDeploysUpToItsOfferingsCeiling(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := strings.Replace(wasmWorker(t), `"add.wasm" = "${path.module}/src/add.wasm"`, `"pad.bin"  = "${path.module}/src/pad.bin"`, 1)
	config = strings.Replace(config, `name         = "wasm"`, `name         = "large"`, 1)
	w := newWorkspace(t, h.URL, h.Key, config)
	src := filepath.Join(w.dir, "src")
	require.NoError(t, os.Mkdir(src, 0o700))
	// 3 MiB that do not compress (a counter through SHA-256), besides a small data module.
	pad := make([]byte, 0, 3<<20)
	for i := 0; len(pad) < 3<<20; i++ {
		sum := sha256.Sum256([]byte(fmt.Sprint(i)))
		pad = append(pad, sum[:]...)
	}
	require.NoError(t, os.WriteFile(filepath.Join(src, "pad.bin"), pad, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "blob.bin"), []byte{7}, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(`import pad from "./pad.bin";
export default { fetch() { return new Response("pad=" + pad.byteLength) } };
`), 0o600))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	w.apply(config)
	answersAt(t, w, h, fmt.Sprintf("pad=%d", len(pad)))

	require.NoError(t, os.WriteFile(filepath.Join(src, "pad.bin"), make([]byte, 10<<20), 0o600))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "Bundle too large")
	require.Contains(t, out, "at most 10485760 (maxBundleBytes")
}

// A bundle esbuild minified, with its source map from module_files (SPEC 3.6): the worker serves,
// and its uncaught exception reads in the log at the original file and line; a map beside no
// module of the bundle fails at plan.
func TestAccASourceMapFromFilesNamesOriginalPlacesInTheLog(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := strings.Replace(wasmWorker(t), `"add.wasm" = "${path.module}/src/add.wasm"
    "blob.bin" = "${path.module}/src/blob.bin"`, `"index.js.map" = "${path.module}/src/index.js.map"`, 1)
	config = strings.Replace(config, `name         = "wasm"`, `name         = "mapped"`, 1)
	require.Contains(t, config, "index.js.map")
	w := newWorkspace(t, h.URL, h.Key, config)
	src := filepath.Join(w.dir, "src")
	require.NoError(t, os.Mkdir(src, 0o700))
	for _, name := range []string{"index.js", "index.js.map"} {
		b, err := os.ReadFile(filepath.Join("..", "internal", "runtime", "testdata", "sourcemap", name))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(src, name), b, 0o600))
	}
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)
	w.apply(config)
	answersAt(t, w, h, "hello world")

	out, err = w.run("output", "-raw", "url")
	require.NoError(t, err, out)
	host := strings.TrimSuffix(strings.TrimPrefix(out, "http://"), ":"+h.EdgePort()+"/")
	_, _, _, err = h.Runtime.TryGet(host, "/?name=boom")
	require.NoError(t, err)
	logs := logsHolding(t, h, "files", "mapped", "no greeting for boom")
	require.Contains(t, logs, "src/greet.js:5:", "the exception names the original file and line:\n%s", logs)
	require.NotContains(t, logs, "index.js:1:")

	orphan := strings.Replace(config, `"index.js.map" = `, `"other.js.map" = `, 1)
	w.write(orphan)
	out, err = w.run("plan", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "Invalid source map")
	require.Contains(t, out, `"other.js" beside it`)
}

// Cron triggers through the shipped module (SPEC 3.6): a bad expression fails at plan under its
// HCL name; crons apply, change in place and plan empty afterwards; and a tick, brought by moving
// the database's clock, runs the worker's scheduled handler, whose line reaches the worker's log.
// takoform_offerings shows how the offering delivers them.
func TestAccCronsThroughTheModuleRunTheScheduledHandler(t *testing.T) {
	t.Parallel()
	h := testhost.Start(t, testhost.Options{})
	config := func(crons string) string {
		c := strings.Replace(wasmWorker(t), `"add.wasm" = "${path.module}/src/add.wasm"
    "blob.bin" = "${path.module}/src/blob.bin"
  }`, `}
  crons = `+crons, 1)
		c = strings.Replace(c, `name         = "wasm"`, `name         = "cron"`, 1)
		require.Contains(t, c, "crons = ")
		return c + `
data "takoform_offerings" "all" {}

output "delivery" {
  value = [for o in data.takoform_offerings.all.offerings : o.cron_delivery if o.kind == "module-worker"]
}
`
	}
	w := newWorkspace(t, h.URL, h.Key, config(`["*/5 * * * *"]`))
	src := filepath.Join(w.dir, "src")
	require.NoError(t, os.Mkdir(src, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(src, "index.js"), []byte(`export default {
  fetch() { return new Response("ok"); },
  scheduled(event) { console.log("tick " + event.cron + " " + new Date(event.scheduledTime).toISOString()); },
};
`), 0o600))
	out, err := w.run("get", "-no-color")
	require.NoError(t, err, out)

	w.write(config(`["61 * * * *"]`))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.Error(t, err, out)
	require.Contains(t, out, "Invalid crons")

	w.apply(config(`["*/5 * * * *"]`))
	out, err = w.run("output", "-json", "delivery")
	require.NoError(t, err, out)
	require.JSONEq(t, `["at-most-once"]`, out)
	w.write(config(`["* * * * *", "*/5 * * * *"]`))
	out, err = w.run("plan", "-input=false", "-no-color")
	require.NoError(t, err, out)
	require.Contains(t, out, "1 to change, 0 to destroy", "a change of crons is in place:\n%s", out)
	w.apply(config(`["* * * * *", "*/5 * * * *"]`))

	var due time.Time
	require.Eventually(t, func() bool {
		return h.DB.QueryRow(ctx(t), `SELECT next_tick FROM worker_crons WHERE cron = '* * * * *' AND next_tick IS NOT NULL`).Scan(&due) == nil
	}, 10*time.Second, 50*time.Millisecond, "the Host computes the first tick")
	_, err = h.DB.Exec(ctx(t), `INSERT INTO clock_skew (skew) VALUES ($1::timestamptz - now() + interval '1 second')
ON CONFLICT (singleton) DO UPDATE SET skew = EXCLUDED.skew`, due)
	require.NoError(t, err)
	tick := `"message":"tick * * * * * ` + due.UTC().Format("2006-01-02T15:04:05.000Z") + `"`
	logs := logsHolding(t, h, "files", "cron", tick)
	// Once; the wall clock may bring ticks of its own meanwhile, at other times.
	require.Equal(t, 1, strings.Count(logs, tick), logs)
}
