// Package runtimeinput is the runtime-input authority (SPEC 3.5): preparations that seal secret
// bindings under a plan-known reference, and the one-shot lease that hands them to the backend.
package runtimeinput

import (
	"context"
	"encoding/hex"
	"errors"

	"github.com/takoform/terraform-provider-takoform/api/apitypes"
	"github.com/takoform/terraform-provider-takoform/internal/apierr"
	"github.com/takoform/terraform-provider-takoform/internal/auth"
	"github.com/takoform/terraform-provider-takoform/internal/runtimeref"
	"github.com/takoform/terraform-provider-takoform/internal/sealing"
	"github.com/takoform/terraform-provider-takoform/internal/store/dbsqlc"
	"github.com/takoform/terraform-provider-takoform/internal/vocab"
)

// PreparationFormat is the format of a preparation request body.
const PreparationFormat = "takoserver.worker-runtime-input-preparation@v1"

// Target names where a runtime input goes (see runtimeref.Target).
type Target = runtimeref.Target

// CommitmentKey is the answer of POST /v1/runtime-input-commitment-keys (SPEC 3.5): the key a
// provider computes a rip2 reference with, and the id of the Host secret it derives from. It is
// the same for the same organization and nonce every time; nothing is written.
type CommitmentKey = apitypes.CommitmentKey

// CommitmentKeyRequest is the body of POST /v1/runtime-input-commitment-keys.
type CommitmentKeyRequest = apitypes.CommitmentKeyRequest

// CommitmentKey answers the organization's commitment key for a nonce.
func (s *Service) CommitmentKey(ctx context.Context, db dbsqlc.DBTX, org auth.Organization, req CommitmentKeyRequest) (CommitmentKey, error) {
	if err := checkNonce(req.MaterialSetNonce); err != nil {
		return CommitmentKey{}, err
	}
	ring, err := s.ring()
	if err != nil {
		return CommitmentKey{}, err
	}
	id, key, err := ring.CommitmentKey(ctx, db, org.ID, req.MaterialSetNonce)
	if err != nil {
		return CommitmentKey{}, err
	}
	return CommitmentKey{Format: runtimeref.CommitmentKeyFormat, CommitmentSecretID: id, CommitmentKey: hex.EncodeToString(key)}, nil
}

func checkNonce(nonce string) error {
	if nonce == "" || len(nonce) > 256 {
		return apierr.New(apierr.InvalidRequest, "materialSetNonce must be 1 to 256 characters")
	}
	return nil
}

// derive recomputes a request's reference in the format it names: rip1 over the values, rip2
// over their commitments under the key of the commitment secret the reference names. A rip2
// reference naming a secret this Host does not have cannot match.
func (s *Service) derive(ctx context.Context, db dbsqlc.DBTX, ring *sealing.Ring, org string, nonce string, t Target, bindings map[string]vocab.Secret, reference string) (runtimeref.Identity, error) {
	p, _ := runtimeref.Parse(reference)
	if p.Version != 2 {
		return Derive(nonce, t, bindings), nil
	}
	key, err := ring.CommitmentKeyUnder(ctx, db, p.SecretID, org, nonce)
	if errors.Is(err, sealing.ErrUnknownCommitmentSecret) {
		return runtimeref.Identity{}, apierr.New(apierr.ReferenceMismatch, "runtimeInputReference names commitment secret %s, which this Host does not hold", p.SecretID)
	}
	if err != nil {
		return runtimeref.Identity{}, err
	}
	return runtimeref.DeriveV2(key, p.SecretID, nonce, t, reveal(bindings)), nil
}

// Derive computes a rip1 reference over secret bindings (see runtimeref.Derive): what providers
// before rip2 send, still accepted.
func Derive(nonce string, t Target, bindings map[string]vocab.Secret) runtimeref.Identity {
	return runtimeref.Derive(nonce, t, reveal(bindings))
}

// reveal is the bindings' plain values, for a derivation that commits to them.
func reveal(bindings map[string]vocab.Secret) map[string]string {
	plain := make(map[string]string, len(bindings))
	for k, v := range bindings {
		plain[k] = v.Reveal()
	}
	return plain
}
