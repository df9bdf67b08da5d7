package canonjson

import (
	"encoding/json"
	"strconv"
	"testing"
	"unicode/utf16"
)

// quoteLikeJSONStringify is a second, independent formulation of JSON.stringify's string quoting:
// it walks UTF-16 code units, as the ECMAScript QuoteJSONString operation does, with a table of
// the escapes, instead of the rune switch of AppendString.
func quoteLikeJSONStringify(s string) string {
	short := map[uint16]string{0x08: `\b`, 0x09: `\t`, 0x0a: `\n`, 0x0c: `\f`, 0x0d: `\r`, 0x22: `\"`, 0x5c: `\\`}
	units := utf16.Encode([]rune(s))
	out := []byte{'"'}
	var run []uint16
	flush := func() {
		out = append(out, string(utf16.Decode(run))...)
		run = run[:0]
	}
	for _, u := range units {
		if esc, ok := short[u]; ok {
			flush()
			out = append(out, esc...)
			continue
		}
		if u < 0x20 {
			flush()
			hex := strconv.FormatUint(uint64(u), 16)
			for len(hex) < 4 {
				hex = "0" + hex
			}
			out = append(out, `\u`+hex...)
			continue
		}
		run = append(run, u)
	}
	flush()
	return string(append(out, '"'))
}

func FuzzAppendStringMatchesJSONStringify(f *testing.F) {
	for _, seed := range []string{"", "plain", "<&>", "\u2028\u2029", "\x00\x1f\x7f", "é☃🐙", "\"\\/", "\xff\xfe", "a\tb\nc\rd\be\ff"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := string(AppendString(nil, s))
		if want := quoteLikeJSONStringify(s); got != want {
			t.Fatalf("AppendString(%q) = %s, independent formulation = %s", s, got, want)
		}
		// Decoding what we encode gives the input back (invalid UTF-8 comes back as U+FFFD,
		// which is all a JavaScript string could have held).
		var back string
		if err := json.Unmarshal([]byte(got), &back); err != nil {
			t.Fatalf("AppendString(%q) = %s is not JSON: %v", s, got, err)
		}
		if want := string([]rune(s)); back != want {
			t.Fatalf("round trip of %q gave %q", want, back)
		}
		// And an object with the string as key and value sorts and decodes too.
		obj := Marshal(map[string]string{s: s, "k": "v"})
		var m map[string]string
		if err := json.Unmarshal(obj, &m); err != nil || m[string([]rune(s))] != string([]rune(s)) {
			t.Fatalf("object %s did not decode back: %v", obj, err)
		}
	})
}
