// Package sealing protects runtime-input values (SPEC 3.5): a key ring in PostgreSQL whose data
// keys are wrapped by the operator's key-encryption key and seal values with AES-256-GCM, and the
// challenge and digest of the readback. Values travel as vocab.Secret, which never prints itself.
package sealing
