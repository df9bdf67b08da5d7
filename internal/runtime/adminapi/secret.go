package adminapi

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

const redacted = "[redacted]"

// Secret is one secret binding's value. Every way of printing it (fmt verbs, JSON, slog) shows
// "[redacted]", so a mistake cannot leak one; Reveal is the single way to read it, and grepping for
// it finds every place a value is used.
type Secret struct{ value string }

// NewSecret wraps a value.
func NewSecret(value string) Secret { return Secret{value: value} }

// Reveal returns the value. Call it only where the value must travel: the request body, the
// sealing of the delivery, and workerd's environment.
func (s Secret) Reveal() string { return s.value }

func (Secret) String() string { return redacted }

// GoString redacts for %#v.
func (Secret) GoString() string { return redacted }

// Format redacts for every verb.
func (Secret) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(redacted)) }

// MarshalJSON redacts: a Secret never reaches a JSON document by accident. SecretsPut writes the
// one wire form that carries values.
func (Secret) MarshalJSON() ([]byte, error) { return json.Marshal(redacted) }

// UnmarshalJSON reads a JSON string.
func (s *Secret) UnmarshalJSON(b []byte) error {
	return json.Unmarshal(b, &s.value)
}

// LogValue redacts in slog.
func (Secret) LogValue() slog.Value { return slog.StringValue(redacted) }
