package server_test

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestBodiesPostgreSQLCannotStoreAnswer400: a body holding a value PostgreSQL refuses (a NUL
// character, a lone UTF-16 surrogate escape, bytes that are not UTF-8, a number beyond 64 bits) is
// a bad request, answered 400 at decode on every route, never a 500 from the database; and it
// leaves nothing behind. A valid surrogate pair is an ordinary character.
func TestBodiesPostgreSQLCannotStoreAnswer400(t *testing.T) {
	t.Parallel()
	h := setup(t)
	worker := func(source string) string {
		return `{"modules":{"index.js":"` + source + `"},"mainModule":"index.js","compatibilityDate":"2025-01-01","requiredSensitiveVars":[]}`
	}
	cases := []struct {
		name, path, body string
	}{
		{"NUL in a module's source", "/v1/spaces/prod/workers/api", worker(`export default {} // \u0000`)},
		{"NUL in a module's name", "/v1/spaces/prod/workers/api",
			`{"modules":{"in\u0000dex.js":"export default {}"},"mainModule":"index.js","compatibilityDate":"2025-01-01","requiredSensitiveVars":[]}`},
		{"NUL in compatibilityDate", "/v1/spaces/prod/workers/api",
			`{"modules":{"index.js":"export default {}"},"mainModule":"index.js","compatibilityDate":"2025-01-01\u0000","requiredSensitiveVars":[]}`},
		{"lone high surrogate", "/v1/spaces/prod/workers/api", worker(`// \ud800`)},
		{"lone low surrogate", "/v1/spaces/prod/workers/api", worker(`// \udc00`)},
		{"high surrogate before a plain escape", "/v1/spaces/prod/workers/api", worker(`// \ud800\u0041`)},
		{"high surrogate at the end of a string", "/v1/spaces/prod/workers/api", worker(`// \uD83D`)},
		{"bytes that are not UTF-8", "/v1/spaces/prod/workers/api", worker("// \xff\xfe")},
		{"NUL in a reservation's subdomain", resPath + "res-api", `{"space":"prod","workerName":"api","subdomain":"shop\u0000"}`},
		{"ttlSeconds beyond 64 bits", resPath + "res-api", `{"space":"prod","workerName":"api","ttlSeconds":99999999999999999999}`},
		{"ttlSeconds as an exponent", resPath + "res-api", `{"space":"prod","workerName":"api","ttlSeconds":1e400}`},
		{"NUL in an endpoint's worker", "/v1/spaces/prod/worker-endpoints/api", `{"worker":"api\u0000"}`},
		{"NUL in a derivation", "/v1/worker-endpoint-origin-derivations", `{"space":"prod","workerName":"api","offeringId":"\u0000"}`},
	}
	for _, c := range cases {
		method := http.MethodPut
		if c.path == "/v1/worker-endpoint-origin-derivations" {
			method = http.MethodPost
		}
		r := h.do(req{method: method, path: c.path, key: h.key, token: "token-storable-000001", body: c.body})
		require.Equal(t, http.StatusBadRequest, r.status, "%s: %s", c.name, r.body)
		r.problem(t, http.StatusBadRequest, "bad_request")
	}
	require.Zero(t, h.count(`SELECT count(*) FROM workers`))
	require.Zero(t, h.count(`SELECT count(*) FROM worker_endpoint_origin_reservations`))
	require.Zero(t, h.count(`SELECT count(*) FROM ownership_bindings`))

	// An astral character, escaped as its surrogate pair, is stored and read back as itself.
	r := h.do(req{method: http.MethodPut, path: "/v1/spaces/prod/workers/api", key: h.key, token: "token-storable-000001",
		body: worker(`export default { async fetch() { return new Response(\"\ud83d\ude00\") } }`)})
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
	require.Contains(t, r.json(t)["modules"].(map[string]any)["index.js"], "\U0001F600")
}
