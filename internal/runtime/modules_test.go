package runtime_test

import (
	"encoding/base64"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/takoform/terraform-provider-takoform/internal/runtime/adminapi"
)

// addWasm is testdata/add.wat compiled: a WebAssembly module exporting add(i32, i32) i32.
const addWasm = "0061736d0100000001070160027f7f017f030201000707010361646400000a09010700200020016a0b"

// A worker imports a WebAssembly module and a data module (bytes, base64 on the admin API as on
// the Host's): the router hands the isolate a compiled WebAssembly.Module and an ArrayBuffer, and
// the worker answers with what it computed from them.
func TestAWorkerImportsWebAssemblyAndDataModules(t *testing.T) {
	t.Parallel()
	f := setup(t)
	wasm, err := hex.DecodeString(addWasm)
	require.NoError(t, err)
	put := f.scriptPut("uid-wasm", 1, "wasm")
	put.Modules = map[string]string{
		"main.js": `import add from "./add.wasm";
import blob from "./blob.bin";
const instance = new WebAssembly.Instance(add);
export default { fetch() {
  const bytes = new Uint8Array(blob);
  return new Response("add=" + instance.exports.add(40, 2) + " blob=" + bytes.length + ":" + bytes[0] + "," + bytes[bytes.length - 1]);
} };`,
		"add.wasm": base64.StdEncoding.EncodeToString(wasm),
		"blob.bin": base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255}),
	}
	_, err = f.client.PutScript(f.ctx, "wasm", put)
	require.NoError(t, err)
	f.route("wasm.workers.localhost", "wasm", "ep-wasm")
	f.waitReady("wasm")
	f.answers("wasm.workers.localhost", "add=42 blob=4:0,255")
}

// A bundle esbuild minified, with its source map beside it (testdata/sourcemap, built by its
// build.sh): the map is never loaded into the isolate, and the worker's uncaught exception and the
// stack it prints itself name the original file and line, not the bundle's one line.
func TestAWorkersLogNamesTheOriginalPlacesOfItsSourceMap(t *testing.T) {
	t.Parallel()
	f := setup(t)
	put := f.scriptPut("uid-mapped", 1, "mapped")
	put.Modules = map[string]string{}
	for _, name := range []string{"index.js", "index.js.map"} {
		b, err := os.ReadFile(filepath.Join("testdata", "sourcemap", name))
		require.NoError(t, err)
		put.Modules[name] = string(b)
	}
	put.MainModule = "index.js"
	_, err := f.client.PutScript(f.ctx, "mapped", put)
	require.NoError(t, err)
	const host = "mapped.workers.localhost"
	f.route(host, "mapped", "ep-mapped")
	f.waitReady("mapped")
	f.answers(host, "hello world")
	for _, q := range []string{"boom", "trace"} {
		_, _, _, err := f.h.TryGet(host, "/?name="+q)
		require.NoError(t, err)
	}

	var page adminapi.LogPage
	require.Eventually(t, func() bool {
		page, err = f.logs("mapped", adminapi.LogQuery{WorkerUID: "uid-mapped"})
		return err == nil && len(page.Entries) >= 2
	}, 10*time.Second, 20*time.Millisecond)
	all := strings.Join(messages(page), "\n---\n")
	t.Log(all)
	require.Contains(t, all, "no greeting for boom")
	require.Contains(t, all, "src/greet.js:5:", "the exception names the line that threw")
	require.Contains(t, all, "src/greet.js:11:", "the printed stack names the line that made it")
	require.NotContains(t, all, "index.js:1:", "no place in the bundle is left")
}

// A node holds no worker's code once it has saved it (SPEC 3.6): its isolates load their modules
// from the node's store, both a new revision beside its incumbent and every worker after the node
// starts again.
func TestANodeReadsItsWorkersCodeFromItsStore(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const host = "stored.workers.localhost"
	f.script("stored", "uid-stored", 1, "v1")
	f.route(host, "stored", "ep-stored")
	f.waitReady("stored")
	f.answers(host, expectReply("v1", ""))
	require.False(t, f.h.Node.CodeHeld("stored"), "the node holds the code it saved")

	f.script("stored", "uid-stored", 2, "v2")
	f.waitStatus("generation 2 serving", func(s adminapi.ScriptStatus) bool {
		return s.Ready && s.Incarnation.Generation == 2
	}, "stored")
	f.answers(host, expectReply("v2", ""))
	require.False(t, f.h.Node.CodeHeld("stored"))

	f.h.Restart(t)
	f.reconnect()
	f.answers(host, expectReply("v2", ""))
	require.False(t, f.h.Node.CodeHeld("stored"), "a start holds the code it read")
}
