package vocab

import (
	"encoding/json"
	"fmt"
	"log/slog"
)

// redacted is what a Secret shows everywhere.
const redacted = "[redacted]"

// Secret holds one secret value, on the Host (a runtime input's values before they are sealed,
// and in a delivery) and on the runtime node (a delivery's values on their way into workerd).
// Every way of printing, formatting, marshalling or logging it shows "[redacted]", so a mistake
// cannot leak one; Reveal is the single way to read it, and grepping for it finds every place a
// value is used.
type Secret struct {
	value string
}

// NewSecret wraps value.
func NewSecret(value string) Secret { return Secret{value: value} }

// Reveal returns the value. Call it only where the value must travel or be used: where it is
// sealed, digested, written into a delivery's one wire form, or into workerd's environment.
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
