package server_test

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func gzipOf(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	w := gzip.NewWriter(&out)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return out.Bytes()
}

// A worker's body may come gzip-compressed and carry a bundle far past the 1 MiB of other
// requests, up to its offering's maxBundleBytes (SPEC 3.6); the request hash is over the
// decompressed body, so the same request sent plain is its replay. Past the offering's ceiling a
// bundle is refused 413 naming it, a body that inflates past the route's bound (a gzip bomb) 413
// as it streams, and an encoding other than gzip 415; none of them leaves a row. The offerings
// show each ceiling.
func TestAWorkerBodyComesCompressedUpToItsOfferingsBundleCeiling(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{"installations": [{"name": "local", "pack": "selfhost"}],
  "offerings": [
    {"id": "big", "kind": "module-worker", "installation": "local", "soldTo": ["*"], "maxBundleBytes": 4194304},
    {"id": "small", "kind": "module-worker", "installation": "local", "soldTo": ["*"], "maxBundleBytes": 1048576},
    {"id": "ep", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]}
  ]}`
	})
	offerings := h.do(req{method: http.MethodGet, path: "/v1/offerings", key: h.key}).json(t)["offerings"].([]any)
	require.EqualValues(t, 4194304, offerings[0].(map[string]any)["maxBundleBytes"])
	require.EqualValues(t, 1048576, offerings[1].(map[string]any)["maxBundleBytes"])
	require.Nil(t, offerings[2].(map[string]any)["maxBundleBytes"], "an endpoint offering has none")

	// 3 MiB of data beside the code: 4 MiB base64, compressed to a few KiB.
	body := workerBody()
	body["offeringId"] = "big"
	body["modules"].(map[string]string)["pad.bin"] = strings.Repeat("AAAA", 3<<20/3)
	plain, err := json.Marshal(body)
	require.NoError(t, err)
	require.Greater(t, len(plain), 4<<20)
	compressed := gzipOf(t, plain)
	put := func(path string, b []byte, headers map[string]string) reply {
		return h.do(req{method: http.MethodPut, path: path, key: h.key, token: tokenA, contentType: "application/json", body: b, headers: headers})
	}
	r := put("/v1/spaces/prod/workers/big", compressed, map[string]string{"Content-Encoding": "gzip"})
	require.Equal(t, http.StatusCreated, r.status, r.body)
	again := put("/v1/spaces/prod/workers/big", plain, nil)
	require.Equal(t, http.StatusCreated, again.status, again.body)
	require.Equal(t, "true", again.header.Get("Takoform-Replayed"), "the same request, decompressed, is the replay")

	body["offeringId"] = "small"
	plain, err = json.Marshal(body)
	require.NoError(t, err)
	r = put("/v1/spaces/prod/workers/small", gzipOf(t, plain), map[string]string{"Content-Encoding": "gzip"})
	r.problem(t, http.StatusRequestEntityTooLarge, "body_too_large")
	require.Contains(t, string(r.body), "offering small takes at most 1048576")

	bomb := gzipOf(t, bytes.Repeat([]byte(" "), 64<<20))
	require.Less(t, len(bomb), 1<<20)
	put("/v1/spaces/prod/workers/bomb", bomb, map[string]string{"Content-Encoding": "gzip"}).problem(t, http.StatusRequestEntityTooLarge, "body_too_large")
	put("/v1/spaces/prod/workers/br", plain, map[string]string{"Content-Encoding": "br"}).problem(t, http.StatusUnsupportedMediaType, "unsupported_media_type")
	require.Equal(t, 1, h.count(`SELECT count(*) FROM workers`), "no refused request left a row")
	// Other routes keep their 1 MiB, compressed or not.
	large := gzipOf(t, []byte(`{"space":"prod","workerName":"x","pad":"`+strings.Repeat("a", 2<<20)+`"}`))
	h.do(req{method: http.MethodPut, path: "/v1/worker-endpoint-origin-reservations/res-x", key: h.key, token: tokenA, contentType: "application/json",
		body: large, headers: map[string]string{"Content-Encoding": "gzip"}}).problem(t, http.StatusRequestEntityTooLarge, "body_too_large")
}

// A source map travels beside its module and is not counted against the offering's ceiling; one
// that maps no module of the bundle, or is past its own bound, is refused 422 and leaves no row
// (SPEC 3.6).
func TestASourceMapIsKeptBesideItsModuleOutsideTheBundleCeiling(t *testing.T) {
	t.Parallel()
	h := setup(t, func(o *options) {
		o.catalogJSON = `{"installations": [{"name": "local", "pack": "selfhost"}],
  "offerings": [
    {"id": "small", "kind": "module-worker", "installation": "local", "soldTo": ["*"], "maxBundleBytes": 1048576},
    {"id": "ep", "kind": "worker-endpoint", "installation": "local", "soldTo": ["*"]}
  ]}`
	})
	sourceMap := func(pad int) string {
		return `{"version":3,"sources":["src/index.ts"],"sourcesContent":["` + strings.Repeat("a", pad) + `"],"mappings":"AAAA"}`
	}
	body := workerBody()
	body["modules"] = map[string]string{
		"index.js":     helloModule + "\n//" + strings.Repeat("x", 900<<10),
		"index.js.map": sourceMap(1536 << 10),
	}
	r := h.putWorker("prod", "mapped", tokenA, body)
	require.Equal(t, http.StatusCreated, r.status, string(r.body))
	require.Contains(t, r.json(t)["modules"].(map[string]any), "index.js.map", "the map is kept with the bundle")

	for _, modules := range []map[string]string{
		{"index.js": helloModule, "other.js.map": sourceMap(1)},       // maps no module
		{"index.js": helloModule, "index.js.map": sourceMap(2 << 20)}, // past 2 MiB
		{"index.js": helloModule, "index.js.map": `{"version":2}`},    // not a version 3 map
	} {
		body["modules"] = modules
		h.putWorker("prod", "refused", tokenA, body).problem(t, http.StatusUnprocessableEntity, "invalid_request")
	}
	require.Equal(t, 1, h.count(`SELECT count(*) FROM workers`), "no refused request left a row")
}

// Bundles at the default maxBundleBytes deploy on a node with its default ceilings (issue 33,
// found by make bench-bundles): an organization's process holding a 10 MiB worker's two versions
// loads a second 10 MiB worker and its update. Its memory ceiling grows with the bundles its isolates hold; a
// fixed allowance per isolate had the process killed at its ceiling while it loaded the second.
func TestTenMiBBundlesDeployWithinTheirProcesssCeiling(t *testing.T) {
	t.Parallel()
	h := setup(t)
	// Generated code, as a bundler writes an application: many small functions.
	code := func(version string) string {
		var b strings.Builder
		b.WriteString("const v = \"" + version + "\";\n")
		for i := 0; b.Len() < 10<<20-64<<10; i++ {
			fmt.Fprintf(&b, "function f%d(a,b){return a*%d+b.length+\"%064x\"}\n", i, i, i)
		}
		b.WriteString("export default { fetch() { return new Response(v + \" \" + typeof f1); } };\n")
		return b.String()
	}
	put := func(name, token, version string) reply {
		b := workerBody()
		b["modules"] = map[string]string{"index.js": code(version)}
		return h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/" + name, key: h.key, token: token, contentType: "application/json",
			body: gzipOf(t, must(json.Marshal(b))), headers: map[string]string{"Content-Encoding": "gzip"}})
	}
	a := put("large-a", tokenA, "v1")
	require.Equal(t, http.StatusCreated, a.status, string(a.body))
	a = put("large-a", tokenA, "v2")
	require.Equal(t, http.StatusOK, a.status, string(a.body))
	b := put("large-b", tokenB, "v1")
	require.Equal(t, http.StatusCreated, b.status, string(b.body))
	b = put("large-b", tokenB, "v2")
	require.Equal(t, http.StatusOK, b.status, string(b.body))
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// A read with ?modules=digests answers each module's digest (a bytes module's over its bytes, as
// filesha256() gives) and the bundle's size instead of the modules; another value is refused.
func TestAWorkerReadOfDigestsCarriesNoModule(t *testing.T) {
	t.Parallel()
	h := setup(t)
	body := workerBody()
	body["modules"] = map[string]string{"index.js": helloModule, "blob.bin": base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255})}
	require.Equal(t, http.StatusCreated, h.putWorker("prod", "api", tokenA, body).status)
	full := h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api", key: h.key}).json(t)
	require.Nil(t, full["moduleSha256"])
	require.Len(t, full["modules"], 2)

	light := h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api?modules=digests", key: h.key}).json(t)
	require.Empty(t, light["modules"])
	blob := sha256.Sum256([]byte{0, 1, 2, 255})
	code := sha256.Sum256([]byte(helloModule))
	require.Equal(t, map[string]any{"blob.bin": hex.EncodeToString(blob[:]), "index.js": hex.EncodeToString(code[:])}, light["moduleSha256"])
	require.EqualValues(t, len("index.js")+len(helloModule)+len("blob.bin")+len(base64.StdEncoding.EncodeToString([]byte{0, 1, 2, 255})), light["bundleBytes"])
	require.Equal(t, full["revision"], light["revision"])
	h.do(req{method: http.MethodGet, path: "/v1/spaces/prod/workers/api?modules=some", key: h.key}).problem(t, http.StatusUnprocessableEntity, "invalid_request")
}
