// Package sealing protects runtime-input values (SPEC 3.5): a key ring in PostgreSQL whose data
// keys are wrapped by the operator's key-encryption key and seal values with AES-256-GCM, and the
// challenge and digest of the readback. Values travel as vocab.Secret, which never prints itself.
package sealing

import "github.com/takoform/terraform-provider-takoform/internal/vocab"

// Secret is vocab.Secret, the one secret type of the Host and the runtime node.
type Secret = vocab.Secret

// NewSecret wraps value.
func NewSecret(value string) Secret { return vocab.NewSecret(value) }
