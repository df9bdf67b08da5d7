// Package canonjson writes the canonical JSON every Takoform digest is taken over: exactly what
// JavaScript's JSON.stringify produces for the same object. No whitespace; keys in the order given
// (an Object) or sorted by UTF-16 code unit (a map); strings with only `"`, `\` and U+0000–U+001F
// escaped and everything else, non-ASCII included, written as UTF-8.
//
// Go's encoding/json is not used: it escapes <, >, & and U+2028/U+2029, which JSON.stringify does not.
package canonjson

import (
	"fmt"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// Number is a JSON number written exactly as given (already in its canonical text).
type Number string

// Field is one key and value of an Object.
type Field struct {
	Key   string
	Value any
}

// Object is a JSON object whose keys keep the order given.
type Object []Field

// Marshal encodes v, which may be a string, bool, nil, an integer, an Object, a map[string]string,
// a map[string]any, or a []any / []string of those.
func Marshal(v any) []byte {
	return appendValue(nil, v)
}

func appendValue(dst []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...)
	case string:
		return AppendString(dst, v)
	case bool:
		return strconv.AppendBool(dst, v)
	case int:
		return strconv.AppendInt(dst, int64(v), 10)
	case int64:
		return strconv.AppendInt(dst, v, 10)
	case Number:
		return append(dst, v...)
	case Object:
		dst = append(dst, '{')
		for i, f := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, f.Key)
			dst = append(dst, ':')
			dst = appendValue(dst, f.Value)
		}
		return append(dst, '}')
	case map[string]string:
		obj := make(Object, 0, len(v))
		for k, val := range v {
			obj = append(obj, Field{k, val})
		}
		return appendValue(dst, sortFields(obj))
	case map[string]any:
		obj := make(Object, 0, len(v))
		for k, val := range v {
			obj = append(obj, Field{k, val})
		}
		return appendValue(dst, sortFields(obj))
	case []string:
		dst = append(dst, '[')
		for i, s := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = AppendString(dst, s)
		}
		return append(dst, ']')
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendValue(dst, e)
		}
		return append(dst, ']')
	default:
		panic(fmt.Sprintf("canonjson: unsupported type %T", v))
	}
}

// sortFields orders keys by UTF-16 code units, as JavaScript compares strings.
func sortFields(obj Object) Object {
	sort.Slice(obj, func(i, j int) bool { return LessUTF16(obj[i].Key, obj[j].Key) })
	return obj
}

// LessUTF16 compares a and b by their UTF-16 code units (JavaScript's default string order).
func LessUTF16(a, b string) bool {
	ua, ub := utf16.Encode([]rune(a)), utf16.Encode([]rune(b))
	for i := 0; i < len(ua) && i < len(ub); i++ {
		if ua[i] != ub[i] {
			return ua[i] < ub[i]
		}
	}
	return len(ua) < len(ub)
}

const hexDigits = "0123456789abcdef"

// AppendString appends s as a JSON string the way JSON.stringify writes it. Invalid UTF-8 is
// written as U+FFFD, as a JavaScript string cannot hold it. Runs that need no escape are copied
// whole: configs and bundles of a megabyte go through here.
func AppendString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	done := 0 // s[:done] is written
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				dst = append(append(dst, s[done:i]...), string(utf8.RuneError)...)
				i++
				done = i
				continue
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		dst = append(dst, s[done:i]...)
		switch c {
		case '"':
			dst = append(dst, '\\', '"')
		case '\\':
			dst = append(dst, '\\', '\\')
		case '\b':
			dst = append(dst, '\\', 'b')
		case '\t':
			dst = append(dst, '\\', 't')
		case '\n':
			dst = append(dst, '\\', 'n')
		case '\f':
			dst = append(dst, '\\', 'f')
		case '\r':
			dst = append(dst, '\\', 'r')
		default:
			dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		done = i
	}
	dst = append(dst, s[done:]...)
	return append(dst, '"')
}
