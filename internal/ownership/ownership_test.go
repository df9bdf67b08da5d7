package ownership

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRequestHashIgnoresFormattingOnly(t *testing.T) {
	t.Parallel()
	a, err := RequestHash("PUT", "/v1/x/a", nil, []byte(`{"b":1,"a":{"y":"<&>","x":[1,2]}}`))
	require.NoError(t, err)
	b, err := RequestHash("PUT", "/v1/x/a", nil, []byte("{ \"a\": {\"x\": [1, 2], \"y\": \"<&>\"},\n  \"b\": 1 }"))
	require.NoError(t, err)
	require.Equal(t, a, b)

	for _, other := range []struct{ method, path, body string }{
		{"DELETE", "/v1/x/a", `{"b":1,"a":{"y":"<&>","x":[1,2]}}`},
		{"PUT", "/v1/x/b", `{"b":1,"a":{"y":"<&>","x":[1,2]}}`},
		{"PUT", "/v1/x/a", `{"b":2,"a":{"y":"<&>","x":[1,2]}}`},
		{"PUT", "/v1/x/a", `{"b":1,"a":{"y":"<&>","x":[2,1]}}`},
	} {
		h, err := RequestHash(other.method, other.path, nil, []byte(other.body))
		require.NoError(t, err)
		require.NotEqual(t, a, h, "%+v", other)
	}
	// If-Match is part of the request: a late copy of an older update is another request.
	rev := int64(3)
	withRevision, err := RequestHash("PUT", "/v1/x/a", &rev, []byte(`{"b":1,"a":{"y":"<&>","x":[1,2]}}`))
	require.NoError(t, err)
	require.NotEqual(t, a, withRevision)
}

func TestCanonicalBody(t *testing.T) {
	t.Parallel()
	got, err := CanonicalBody([]byte(` {"z":null,"a":true,"m":1.50,"s":"é\u2028"} `))
	require.NoError(t, err)
	require.Equal(t, "{\"a\":true,\"m\":1.50,\"s\":\"é\u2028\",\"z\":null}", string(got))
	empty, err := CanonicalBody([]byte("  "))
	require.NoError(t, err)
	require.Nil(t, empty)
	_, err = CanonicalBody([]byte("{"))
	require.Error(t, err)
}

func TestValidToken(t *testing.T) {
	t.Parallel()
	require.True(t, ValidToken("abcdefghijklmnop"))
	require.True(t, ValidToken("A-Z_a.z~0123456789"))
	require.False(t, ValidToken("short"))
	require.False(t, ValidToken("has space in it ok"))
	long := make([]byte, 129)
	for i := range long {
		long[i] = 'a'
	}
	require.False(t, ValidToken(string(long)))
}
