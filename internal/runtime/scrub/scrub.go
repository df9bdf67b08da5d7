// Package scrub removes a worker's delivered secret values from what the runtime node keeps or
// logs of its output (SPEC 5.1: scrubbing also covers the base64 and hex forms of each value), in
// every form a worker naturally prints one: as it is, as JSON writes it inside a string, line by
// line when it has several, percent-encoded in a URL or a form body, and encoded.
package scrub

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"sort"
	"strings"

	"github.com/takoform/terraform-provider-takoform/internal/canonjson"
)

// Redacted replaces every form of a value.
const Redacted = "[redacted]"

// minPiece is the shortest line of a multi-line value, or encoded form, scrubbed on its own
// (shorter ones, such as a blank line, would redact ordinary output for nothing).
const minPiece = 6

// Scrubber removes the forms of some values from text. The zero value removes nothing.
type Scrubber struct {
	forms []string
}

// New is the scrubber of values.
func New(values []string) Scrubber { return Scrubber{forms: Forms(values)} }

// Empty reports whether the scrubber removes nothing.
func (s Scrubber) Empty() bool { return len(s.forms) == 0 }

// Len is the number of forms it removes.
func (s Scrubber) Len() int { return len(s.forms) }

// Apply returns text with every form of every value replaced by Redacted.
func (s Scrubber) Apply(text string) string {
	for _, f := range s.forms {
		if strings.Contains(text, f) {
			text = strings.ReplaceAll(text, f, Redacted)
		}
	}
	return text
}

// Forms lists what to remove from output for values: each value as it is, as JSON writes it
// inside a string (JSON.stringify of env or of an object holding it), each line of a multi-line
// value (a PEM key printed line by line), and its encoded forms (encodedForms). Longest first, so
// that a longer form is removed before a piece of it.
func Forms(values []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(v string) {
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	for _, v := range values {
		add(v)
		// Inside a JSON string as JavaScript writes one (JSON.stringify escapes only ", \ and
		// controls) and as Go's encoder does (it escapes <, >, &, U+2028 and U+2029 too).
		stringified := canonjson.AppendString(nil, v)
		add(string(stringified[1 : len(stringified)-1]))
		if raw, err := json.Marshal(v); err == nil {
			add(string(raw[1 : len(raw)-1]))
		}
		for _, form := range urlForms(v) {
			add(form)
		}
		if strings.ContainsAny(v, "\r\n") {
			for _, piece := range strings.FieldsFunc(v, func(r rune) bool { return r == '\n' || r == '\r' }) {
				if len(strings.TrimSpace(piece)) >= minPiece {
					add(piece)
				}
			}
		}
		for _, form := range encodedForms(v) {
			if len(form) >= minPiece {
				add(form)
			}
		}
	}
	sort.Slice(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
	return out
}

// encodedForms lists how a worker can print v without printing it: btoa(v) and base64url, padded
// and not, lower- and upper-case hex, and, for v inside a longer base64 string (btoa(prefix + v)),
// the run of base64 characters that v alone decides at each of the three byte alignments. What
// stays of such a string is at most one character at each end of v that mixes its first or last
// bits with its neighbours'.
func encodedForms(v string) []string {
	b := []byte(v)
	forms := []string{
		base64.StdEncoding.EncodeToString(b), base64.RawStdEncoding.EncodeToString(b),
		base64.URLEncoding.EncodeToString(b), base64.RawURLEncoding.EncodeToString(b),
		hex.EncodeToString(b), strings.ToUpper(hex.EncodeToString(b)),
	}
	for offset := range 3 {
		shifted := base64.RawStdEncoding.EncodeToString(append(make([]byte, offset), b...))
		// Character i covers bits 6i..6i+5 of the shifted bytes; v's bits are 8*offset..8*(offset+len).
		first, end := (8*offset+5)/6, 8*(offset+len(b))/6
		if first >= end {
			continue
		}
		run := shifted[first:end]
		forms = append(forms, run, strings.NewReplacer("+", "-", "/", "_").Replace(run))
	}
	return forms
}

// urlForms lists v percent-encoded as a worker's URL code writes it: encodeURIComponent (which
// leaves A-Z a-z 0-9 - _ . ! ~ * ' ( ) as they are), URLSearchParams and form bodies
// (application/x-www-form-urlencoded: A-Z a-z 0-9 * - . _ kept, a space as +), and encodeURI
// (which also keeps the URI's reserved characters). Percent escapes are upper-case, as
// JavaScript writes them, and lower-case too.
func urlForms(v string) []string {
	component := percentEncode(v, "-_.!~*'()", false)
	form := percentEncode(v, "*-._", true)
	uri := percentEncode(v, "-_.!~*'();/?:@&=+$,#", false)
	out := []string{component, form, uri}
	for _, f := range []string{component, form, uri} {
		out = append(out, lowerEscapes(f))
	}
	return out
}

// percentEncode escapes every UTF-8 byte of v but ASCII letters, digits and keep; with plus, a
// space is written +.
func percentEncode(v, keep string, plus bool) string {
	const digits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c < 0x80 && strings.IndexByte(keep, c) >= 0:
			b.WriteByte(c)
		case c == ' ' && plus:
			b.WriteByte('+')
		default:
			b.WriteByte('%')
			b.WriteByte(digits[c>>4])
			b.WriteByte(digits[c&15])
		}
	}
	return b.String()
}

// lowerEscapes writes the hex digits of every percent escape in lower case.
func lowerEscapes(s string) string {
	b := []byte(s)
	for i := 0; i+2 < len(b); i++ {
		if b[i] == '%' {
			for j := i + 1; j <= i+2; j++ {
				if 'A' <= b[j] && b[j] <= 'F' {
					b[j] += 'a' - 'A'
				}
			}
			i += 2
		}
	}
	return string(b)
}

// Merge is a scrubber of both s's values and t's.
func (s Scrubber) Merge(t Scrubber) Scrubber {
	seen := make(map[string]bool, len(s.forms)+len(t.forms))
	out := make([]string, 0, len(s.forms)+len(t.forms))
	for _, f := range append(append([]string(nil), s.forms...), t.forms...) {
		if !seen[f] {
			seen[f] = true
			out = append(out, f)
		}
	}
	sort.Slice(out, func(a, b int) bool { return len(out[a]) > len(out[b]) })
	return Scrubber{forms: out}
}
