-- name: PreparationSweep
-- Lazy expiry (SPEC 3.5): prepared rows expire after an hour, claims after fifteen minutes. An
-- expired row keeps only value-free identity.
UPDATE runtime_input_preparations
SET status = 'expired', epoch = epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL, updated_at = now()
WHERE organization_id = @organization_id
  AND ((status = 'prepared' AND expires_at <= now()) OR (status = 'claimed' AND claim_expires_at <= now()));

-- name: PreparationInsert
INSERT INTO runtime_input_preparations (
    organization_id, operation_id, preparation_id, reference, material_set_nonce, material_set_id,
    space, worker_name, bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin,
    binding_names, sealing_key_id, sealing_nonce, ciphertext, material_digest, digest_key_id, status, expires_at)
VALUES (@organization_id, @operation_id, @preparation_id, @reference, @material_set_nonce, @material_set_id,
        @space, @worker_name, @bundle_name, @endpoint_name, @origin_reservation_id, @canonical_public_origin,
        @binding_names, @sealing_key_id, @sealing_nonce, @ciphertext, @material_digest, @digest_key_id, 'prepared',
        now() + interval '1 hour');

-- name: PreparationSelect
-- By operation id, or by preparation id when operation_id is null.
SELECT organization_id, operation_id, preparation_id, reference, material_set_nonce, material_set_id, space, worker_name,
       bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin, binding_names, status, epoch,
       expires_at, claim_expires_at, worker_uid, digest_key_id, material_digest
FROM runtime_input_preparations
WHERE organization_id = @organization_id
  AND ((@operation_id::text IS NOT NULL AND operation_id = @operation_id::text)
       OR (@operation_id::text IS NULL AND preparation_id = @preparation_id))
FOR UPDATE;

-- name: PreparationAbort
-- prepared | claimed -> aborted: revokes an undispatched handoff and drops the ciphertext.
UPDATE runtime_input_preparations
SET status = 'aborted', epoch = epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL, updated_at = now()
WHERE organization_id = @organization_id AND operation_id = @operation_id AND status IN ('prepared', 'claimed');

-- name: PreparationAcquire
-- prepared -> claimed. Validates, in this statement, the reference, the live bound/activated
-- reservation bound to this exact worker, and the live worker, before any backend call; claims the exact operation,
-- target and worker, and records the reservation revision and placement in dedicated columns.
UPDATE runtime_input_preparations p
SET status = 'claimed', epoch = p.epoch + 1, claim_operation_id = @claim_operation_id,
    worker_uid = @worker_uid, worker_revision = @worker_revision, reservation_revision = r.revision,
    offering_id = r.offering_id, offering_digest = r.offering_digest, pack = r.pack, installation = r.installation,
    native_name = @native_name, claimed_at = coalesce(p.claimed_at, now()),
    claim_expires_at = coalesce(p.claim_expires_at, now() + interval '15 minutes'), updated_at = now()
FROM worker_endpoint_origin_reservations r
WHERE p.organization_id = @organization_id AND p.operation_id = @operation_id
  AND p.epoch = @epoch AND p.reference = @reference
  -- A fresh claim, or the same incarnation revalidating its own undispatched claim (its retry
  -- after an interruption); never a second claim by anyone else.
  AND ((p.status = 'prepared' AND p.expires_at > now())
       OR (p.status = 'claimed' AND p.worker_uid = @worker_uid AND p.claim_expires_at > now()))
  AND p.space = @space AND p.worker_name = @worker_name
  AND r.organization_id = p.organization_id AND r.id = p.origin_reservation_id
  AND r.status IN ('bound', 'activated') AND r.bound_worker_uid = @worker_uid
  AND r.canonical_origin = p.canonical_public_origin AND r.space = p.space AND r.worker_name = p.worker_name
  -- The worker must be live at the claimed revision. The share lock serializes the claim with the
  -- worker's deletion, which locks the row before it looks for claims: a worker is never deleted
  -- under an unexpired claim, and a deleting worker is never claimed.
  AND EXISTS (SELECT 1 FROM workers w
              WHERE w.uid = @worker_uid AND w.revision = @worker_revision AND w.status = 'live'
              FOR SHARE)
RETURNING p.epoch;

-- name: PreparationDispatch
-- claimed -> dispatched. Revalidates the reservation (same revision, still bound to the worker),
-- the worker's exact UID and revision, the placement and offering digest, and that no deletion
-- attestation is open for the worker; and clears the ciphertext in this same compare-and-swap.
-- The sealed material is returned from the row as it was, for the one delivery.
WITH cur AS (
    SELECT organization_id, operation_id, sealing_key_id, sealing_nonce, ciphertext
    FROM runtime_input_preparations
    WHERE organization_id = @organization_id AND operation_id = @operation_id
    FOR UPDATE
)
UPDATE runtime_input_preparations p
SET status = 'dispatched', epoch = p.epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL,
    dispatched_at = now(), updated_at = now()
FROM cur, workers w, worker_endpoint_origin_reservations r
WHERE p.organization_id = cur.organization_id AND p.operation_id = cur.operation_id
  AND p.status = 'claimed' AND p.epoch = @epoch AND p.claim_expires_at > now()
  AND w.uid = p.worker_uid AND w.revision = p.worker_revision AND w.status = 'live'
  AND w.offering_id = p.offering_id AND w.offering_digest = p.offering_digest
  AND w.pack = p.pack AND w.installation = p.installation
  AND r.organization_id = p.organization_id AND r.id = p.origin_reservation_id
  AND r.revision = p.reservation_revision AND r.status IN ('bound', 'activated') AND r.bound_worker_uid = p.worker_uid
  AND NOT EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = p.worker_uid AND a.status = 'open')
RETURNING cur.sealing_key_id, cur.sealing_nonce, cur.ciphertext, p.epoch;

-- name: PreparationSealed
-- The sealed material of a claimed row, read (and locked) to be opened before the dispatch CAS.
SELECT sealing_key_id, sealing_nonce, ciphertext
FROM runtime_input_preparations
WHERE organization_id = @organization_id AND operation_id = @operation_id AND status = 'claimed'
FOR UPDATE;

-- name: PreparationSettle
-- dispatched -> settled, only when the keyed digest of the backend's authoritative readback
-- matches the digest of what was sealed.
UPDATE runtime_input_preparations
SET status = 'settled', epoch = epoch + 1, settled_at = now(), updated_at = now()
WHERE organization_id = @organization_id AND operation_id = @operation_id
  AND status = 'dispatched' AND epoch = @epoch AND material_digest = @readback_digest
RETURNING epoch;

-- name: PreparationFail
-- Fails closed: the row keeps only value-free identity and can never be claimed again.
UPDATE runtime_input_preparations
SET status = 'failed', epoch = epoch + 1, failure = @failure, sealing_key_id = NULL, sealing_nonce = NULL,
    ciphertext = NULL, updated_at = now()
WHERE organization_id = @organization_id AND operation_id = @operation_id
  AND status IN ('prepared', 'claimed', 'dispatched');

-- name: PreparationsDispatchedByOperation
-- Leases an operation dispatched but never settled: recovery settles them by readback or fails
-- them; it never dispatches again.
SELECT organization_id, operation_id, epoch, digest_key_id, material_digest, native_name, installation
FROM runtime_input_preparations
WHERE claim_operation_id = @claim_operation_id AND status = 'dispatched'
FOR UPDATE;

-- name: PreparationClaimsOnWorker
-- Unexpired claims on a worker: its deletion waits for them.
SELECT operation_id FROM runtime_input_preparations
WHERE worker_uid = @worker_uid AND status = 'claimed' AND claim_expires_at > now();
