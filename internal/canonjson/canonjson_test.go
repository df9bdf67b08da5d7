package canonjson

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMarshalMatchesJSONStringify(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		in   any
		want string
	}{
		{"ordered object keeps order", Object{{"b", "1"}, {"a", "2"}}, `{"b":"1","a":"2"}`},
		{"map sorted by code unit", map[string]string{"b": "x", "B": "y", "a": "z"}, `{"B":"y","a":"z","b":"x"}`},
		{"html characters unescaped", "<a href='x'>&</a>", `"<a href='x'>&</a>"`},
		{"line separators unescaped", "\u2028\u2029", "\"\u2028\u2029\""},
		{"short escapes", "\b\t\n\f\r\"\\", `"\b\t\n\f\r\"\\"`},
		{"other controls as \\u00xx", "\x00\x1f\x0b", `"\u0000\u001f\u000b"`},
		{"non-ascii raw", "héllo ☃ 🐙", `"héllo ☃ 🐙"`},
		{"delete not escaped", "\x7f", "\"\x7f\""},
		{"nested", Object{{"o", Object{{"k", nil}, {"b", true}}}, {"n", 3}}, `{"o":{"k":null,"b":true},"n":3}`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.Equal(t, c.want, string(Marshal(c.in)))
		})
	}
}

func TestLessUTF16OrdersSupplementaryBeforeHighBMP(t *testing.T) {
	t.Parallel()
	// U+1F419 is the surrogate pair D83D DC19, which sorts before U+FF21 in UTF-16 but after it in
	// code points: JavaScript uses the former.
	require.True(t, LessUTF16("🐙", "Ａ"))
	require.False(t, LessUTF16("Ａ", "🐙"))
}
