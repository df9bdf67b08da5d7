// Package leakscan finds a secret in text however it was encoded on the way there: plain, or
// inside base64 (standard or URL alphabet, padded or raw) or hex, nested a few levels deep (a
// provider that writes bindings as JSON bytes into private state, which the CLI stores as base64,
// leaves base64 of base64). Tests use it to search state files, plans, logs and dumps for a canary.
package leakscan

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"regexp"
	"strconv"
	"strings"
)

// Depth is how many layers of encoding Find decodes by default.
const Depth = 4

// minRun is the shortest encoded run worth decoding: shorter runs cannot hold a useful secret and
// are everywhere in ordinary text.
const minRun = 12

var (
	stdRun = regexp.MustCompile(`[A-Za-z0-9+/]{` + strconv.Itoa(minRun) + `,}={0,2}`)
	urlRun = regexp.MustCompile(`[A-Za-z0-9_-]{` + strconv.Itoa(minRun) + `,}={0,2}`)
	hexRun = regexp.MustCompile(`[0-9A-Fa-f]{` + strconv.Itoa(minRun) + `,}`)
)

// Find reports whether secret occurs in text, directly or under up to depth layers of base64 and
// hex encoding, and if so the chain of decodings that reveals it ("" when it is there in plain,
// else e.g. "base64 > hex").
func Find(text []byte, secret string, depth int) (string, bool) {
	if secret == "" {
		return "", false
	}
	s := &scanner{secret: []byte(secret), seen: map[string]bool{}}
	return s.find(text, depth, "")
}

// FindString is Find over a string with the default depth.
func FindString(text, secret string) (string, bool) { return Find([]byte(text), secret, Depth) }

type scanner struct {
	secret []byte
	seen   map[string]bool
}

func (s *scanner) find(text []byte, depth int, chain string) (string, bool) {
	if bytes.Contains(text, s.secret) {
		return chain, true
	}
	if depth == 0 {
		return "", false
	}
	for _, layer := range s.decodings(text) {
		if s.seen[string(layer.data)] {
			continue
		}
		s.seen[string(layer.data)] = true
		if c, ok := s.find(layer.data, depth-1, join(chain, layer.name)); ok {
			return c, true
		}
	}
	return "", false
}

type layer struct {
	name string
	data []byte
}

// decodings is every plausible decoding of every encoded run in text. A run may start inside a
// longer run of the same alphabet (a prefix glued to it), so each of the first offsets is tried.
func (s *scanner) decodings(text []byte) []layer {
	var out []layer
	for _, m := range stdRun.FindAll(text, -1) {
		out = append(out, base64Decodings("base64", base64.RawStdEncoding, m)...)
	}
	for _, m := range urlRun.FindAll(text, -1) {
		out = append(out, base64Decodings("base64url", base64.RawURLEncoding, m)...)
	}
	for _, m := range hexRun.FindAll(text, -1) {
		for off := 0; off < 2 && len(m)-off >= minRun; off++ {
			run := m[off:]
			run = run[:len(run)/2*2]
			if d, err := hex.DecodeString(string(run)); err == nil {
				out = append(out, layer{"hex", d})
			}
		}
	}
	return out
}

func base64Decodings(name string, enc *base64.Encoding, m []byte) []layer {
	run := strings.TrimRight(string(m), "=")
	var out []layer
	for off := 0; off < 4 && len(run)-off >= minRun; off++ {
		r := run[off:]
		if len(r)%4 == 1 {
			r = r[:len(r)-1]
		}
		if d, err := enc.DecodeString(r); err == nil {
			out = append(out, layer{name, d})
		}
	}
	return out
}

func join(chain, name string) string {
	if chain == "" {
		return name
	}
	return chain + " > " + name
}
