package adminapi

import "github.com/takoform/terraform-provider-takoform/internal/vocab"

// Secret is vocab.Secret, the one secret type of the Host and the runtime node: every way of
// printing it shows "[redacted]"; SecretsPut writes the one wire form that carries values.
type Secret = vocab.Secret

// NewSecret wraps a value.
func NewSecret(value string) Secret { return vocab.NewSecret(value) }
