package runtime_test

import (
	"encoding/base64"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"
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
