// Package sealing protects runtime-input values (SPEC 3.5): a Secret type that never prints
// itself, a key ring in PostgreSQL whose data keys are wrapped by the operator's key-encryption
// key and seal values with AES-256-GCM, and the challenge and digest of the readback.
package sealing

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

// redacted is what a Secret shows everywhere.
const redacted = "[redacted]"

// Secret holds one secret value. Every way of printing, formatting, marshalling or logging it
// shows "[redacted]"; only Reveal gives the value, for the few places that must use it.
type Secret struct {
	value string
}

// NewSecret wraps value.
func NewSecret(value string) Secret { return Secret{value: value} }

// Reveal returns the value. Call it only where the value is sealed, digested or delivered.
func (s Secret) Reveal() string { return s.value }

func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) Format(f fmt.State, _ rune)   { _, _ = f.Write([]byte(redacted)) }
func (Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + redacted + `"`), nil }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }

// UnmarshalJSON reads a secret from a JSON string, so request bodies decode straight into it.
func (s *Secret) UnmarshalJSON(b []byte) error {
	var v string
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("a secret value must be a JSON string")
	}
	s.value = v
	return nil
}
