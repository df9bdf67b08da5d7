-- name: PreparationSweep :exec
-- Lazy expiry (SPEC 3.5) on the write path: prepared rows expire after an hour, claims after
-- fifteen minutes. An expired row keeps only value-free identity.
UPDATE runtime_input_preparations
SET status = 'expired', epoch = epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND operation_id = @operation_id
  AND ((status = 'prepared' AND expires_at <= (SELECT db_now())) OR (status = 'claimed' AND claim_expires_at <= (SELECT db_now())));

-- name: PreparationInsert :exec
INSERT INTO runtime_input_preparations (
    organization_id, operation_id, preparation_id, reference, material_set_nonce, material_set_id,
    space, worker_name, bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin,
    binding_names, sealing_key_id, sealing_nonce, ciphertext, material_digest, digest_key_id, status, expires_at,
    created_at, updated_at)
VALUES (@organization_id, @operation_id, @preparation_id, @reference, @material_set_nonce, @material_set_id,
        @space, @worker_name, @bundle_name, @endpoint_name, @origin_reservation_id, @canonical_public_origin,
        @binding_names, @sealing_key_id, @sealing_nonce, @ciphertext, @material_digest, @digest_key_id, 'prepared',
        (SELECT db_now()) + interval '1 hour', (SELECT db_now()), (SELECT db_now()));

-- name: PreparationGet :one
-- A preparation as reads see it: its status as of database time, computed, not written. By
-- operation id, by preparation id, or by reference, within one organization; with the owning
-- token of its ownership key (its operation id), so that a GET is one round trip.
SELECT p.organization_id, p.operation_id, p.preparation_id, p.reference, p.material_set_nonce, p.material_set_id, p.space, p.worker_name,
       p.bundle_name, p.endpoint_name, p.origin_reservation_id, p.canonical_public_origin, p.binding_names,
       (CASE WHEN (p.status = 'prepared' AND p.expires_at <= (SELECT db_now())) OR (p.status = 'claimed' AND p.claim_expires_at <= (SELECT db_now()))
             THEN 'expired' ELSE p.status END)::runtime_input_status AS status,
       p.epoch, p.expires_at, p.claim_expires_at, p.worker_uid, p.worker_revision, p.digest_key_id, p.material_digest, p.failure,
       COALESCE((SELECT b.token FROM ownership_bindings b
                 WHERE b.organization_id = p.organization_id AND b.kind = @ownership_kind AND b.external_key = p.operation_id), '')::text AS ownership_token
FROM runtime_input_preparations p
WHERE p.organization_id = @organization_id
  AND (p.operation_id = sqlc.narg('operation_id') OR p.preparation_id = sqlc.narg('preparation_id') OR p.reference = sqlc.narg('reference'));

-- name: PreparationLock :one
-- The row a mutation decides on, locked (the caller swept it first in this transaction).
SELECT organization_id, operation_id, preparation_id, reference, material_set_nonce, material_set_id, space, worker_name,
       bundle_name, endpoint_name, origin_reservation_id, canonical_public_origin, binding_names, status,
       epoch, expires_at, claim_expires_at, worker_uid, worker_revision, digest_key_id, material_digest, failure
FROM runtime_input_preparations
WHERE organization_id = @organization_id
  AND (operation_id = sqlc.narg('operation_id') OR preparation_id = sqlc.narg('preparation_id'))
FOR UPDATE;

-- name: PreparationAbort :execrows
-- prepared | claimed -> aborted: revokes an undispatched handoff and drops the ciphertext.
UPDATE runtime_input_preparations
SET status = 'aborted', epoch = epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND operation_id = @operation_id AND status IN ('prepared', 'claimed');

-- name: PreparationAcquire :one
-- prepared -> claimed. Validates, in this statement, the reference, the live bound or activated
-- reservation bound to this exact worker, and the worker live at the claimed revision, before any
-- backend call; claims for the exact operation, target and worker, and records the reservation
-- revision and placement in dedicated columns. The same incarnation may revalidate its own
-- undispatched claim (its retry after an interruption); nobody else gets a second claim.
UPDATE runtime_input_preparations p
SET status = 'claimed', epoch = p.epoch + 1, claim_operation_id = @claim_operation_id,
    worker_uid = @worker_uid, worker_revision = @worker_revision, reservation_revision = r.revision,
    offering_id = r.offering_id, offering_digest = r.offering_digest, pack = r.pack, installation = r.installation,
    native_name = @native_name, claimed_at = coalesce(p.claimed_at, (SELECT db_now())),
    claim_expires_at = coalesce(p.claim_expires_at, (SELECT db_now()) + interval '15 minutes'), updated_at = (SELECT db_now())
FROM worker_endpoint_origin_reservations r
WHERE p.organization_id = @organization_id AND p.operation_id = @operation_id
  AND p.epoch = @epoch AND p.reference = @reference
  AND ((p.status = 'prepared' AND p.expires_at > (SELECT db_now()))
       OR (p.status = 'claimed' AND p.worker_uid = @worker_uid AND p.claim_expires_at > (SELECT db_now())))
  AND p.space = @space AND p.worker_name = @worker_name
  AND r.organization_id = p.organization_id AND r.id = p.origin_reservation_id
  AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) IN ('bound', 'activated')
  AND r.bound_worker_uid = @worker_uid
  AND r.canonical_origin = p.canonical_public_origin AND r.space = p.space AND r.worker_name = p.worker_name
  -- The worker must stand at the claimed revision (live, or being created by this very
  -- operation). The share lock serializes the claim with the worker's deletion, which locks the
  -- row before it looks for claims: a worker is never deleted under an unexpired claim.
  AND EXISTS (SELECT 1 FROM workers w
              WHERE w.uid = @worker_uid AND w.revision = @worker_revision
                AND (w.status = 'live' OR (w.status = 'creating' AND w.operation_id = @claim_operation_id))
              FOR SHARE)
RETURNING p.epoch;

-- name: PreparationSealed :one
-- The sealed material of a claimed row, locked, to be opened right before the dispatch CAS.
SELECT sealing_key_id, sealing_nonce, ciphertext
FROM runtime_input_preparations
WHERE organization_id = @organization_id AND operation_id = @operation_id AND status = 'claimed'
FOR UPDATE;

-- name: PreparationDispatch :one
-- claimed -> dispatched. Revalidates the reservation (same revision, still bound to the worker),
-- the worker's exact UID and revision, the placement and offering digest, and that no deletion
-- attestation is open for the worker; and clears the ciphertext in this same compare-and-swap,
-- before the backend request (SPEC 3.5). A backend that settles on the value-free readback gets
-- its expected digest recorded in the same CAS (null for the keyed challenge), and a pool its
-- values sealed to the pool's public key (SPEC 6.2; null on other packs).
UPDATE runtime_input_preparations p
SET status = 'dispatched', epoch = p.epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL,
    delivery_digest = sqlc.narg('delivery_digest')::bytea, pool_blob = sqlc.narg('pool_blob')::bytea,
    dispatched_at = (SELECT db_now()), updated_at = (SELECT db_now())
FROM workers w, worker_endpoint_origin_reservations r
WHERE p.organization_id = @organization_id AND p.operation_id = @operation_id
  AND p.status = 'claimed' AND p.epoch = @epoch AND p.claim_expires_at > (SELECT db_now())
  AND w.uid = p.worker_uid AND w.revision = p.worker_revision
  AND (w.status = 'live' OR (w.status = 'creating' AND w.operation_id = p.claim_operation_id))
  AND w.offering_id = p.offering_id AND w.offering_digest = p.offering_digest
  AND w.pack = p.pack AND w.installation = p.installation
  AND r.organization_id = p.organization_id AND r.id = p.origin_reservation_id
  AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND r.revision = p.reservation_revision AND r.status IN ('bound', 'activated') AND r.bound_worker_uid = p.worker_uid
  AND NOT EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = p.worker_uid AND a.status = 'open')
RETURNING p.epoch;

-- name: PreparationSettle :one
-- dispatched -> settled, only when the backend's answer to the challenge matches the digest
-- stored at sealing, or, for a value-free readback, the digest the dispatch recorded. The pool
-- blobs of the worker's settled deliveries dispatched before this one go in the same statement:
-- only the newest is ever named to a node again (a recovery settling an older one late clears
-- nothing newer).
WITH settled AS (
    UPDATE runtime_input_preparations t
    SET status = 'settled', epoch = t.epoch + 1, settled_at = (SELECT db_now()), updated_at = (SELECT db_now())
    WHERE t.organization_id = @organization_id AND t.operation_id = @operation_id
      AND t.status = 'dispatched' AND t.epoch = @epoch AND coalesce(t.delivery_digest, t.material_digest) = @readback_digest
    RETURNING t.epoch, t.worker_uid, t.dispatched_at
), superseded AS (
    UPDATE runtime_input_preparations o
    SET pool_blob = NULL, updated_at = (SELECT db_now())
    FROM settled s
    WHERE o.worker_uid = s.worker_uid AND o.status = 'settled' AND o.pool_blob IS NOT NULL
      AND o.dispatched_at < s.dispatched_at
)
SELECT epoch FROM settled;

-- name: PreparationFail :execrows
-- Fails closed: the row keeps only value-free identity and can never be claimed again.
UPDATE runtime_input_preparations
SET status = 'failed', epoch = epoch + 1, failure = @failure, sealing_key_id = NULL, sealing_nonce = NULL,
    ciphertext = NULL, pool_blob = NULL, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND operation_id = @operation_id
  AND status IN ('prepared', 'claimed', 'dispatched');

-- name: PreparationsDispatchedByOperation :many
-- Leases an interrupted operation dispatched but never settled: recovery settles them by the
-- challenge readback or fails them; it never dispatches again.
SELECT organization_id, operation_id, preparation_id, material_set_id, epoch, digest_key_id, material_digest, delivery_digest, worker_uid, binding_names, native_name, installation
FROM runtime_input_preparations
WHERE claim_operation_id = @claim_operation_id AND status = 'dispatched';

-- name: PreparationClaimsOnWorker :many
-- Unexpired claims on a worker: its deletion waits for them.
SELECT operation_id FROM runtime_input_preparations
WHERE worker_uid = @worker_uid AND status = 'claimed' AND claim_expires_at > (SELECT db_now());

-- name: PreparationSweepAll :execrows
-- The janitor's expiry of preparations past their window, so that no ciphertext outlives it even
-- when nothing touches the row again: at most batch rows a statement (the caller repeats it), so
-- that one statement never holds the locks of thousands of organizations' quota counters; rows
-- another transaction holds are left for the next pass.
UPDATE runtime_input_preparations p
SET status = 'expired', epoch = p.epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL, updated_at = (SELECT db_now())
FROM (SELECT x.organization_id, x.operation_id FROM runtime_input_preparations x
      WHERE (x.status = 'prepared' AND x.expires_at <= (SELECT db_now())) OR (x.status = 'claimed' AND x.claim_expires_at <= (SELECT db_now()))
      LIMIT @batch::integer
      FOR UPDATE SKIP LOCKED) due
WHERE p.organization_id = due.organization_id AND p.operation_id = due.operation_id;

-- name: PoolBlobsSweep :execrows
-- Pool blobs no node is ever named again: their worker is gone (deleted, or replaced by a new
-- UID), or it no longer consumes that runtime input (an update dropped or replaced its secrets).
UPDATE runtime_input_preparations p
SET pool_blob = NULL, updated_at = (SELECT db_now())
WHERE p.pool_blob IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM workers w
                  WHERE w.uid = p.worker_uid AND w.status <> 'deleted'
                    AND w.organization_id = p.organization_id AND w.runtime_input_reference = p.reference);

-- name: ReconcileDeliveries :many
-- The deliveries an installation's node must hold that can be named to it again: each live
-- worker's newest settled delivery whose pool blob the Host keeps, of the runtime input the
-- worker consumes now; and the worker's deliveries it superseded (a node back from an old backup
-- may hold one).
SELECT p.worker_uid::uuid AS worker_uid, p.native_name::text AS native_name, p.preparation_id, p.material_set_id,
       p.binding_names, p.pool_blob,
       ARRAY(SELECT o.material_set_id::text FROM runtime_input_preparations o
             WHERE o.worker_uid = p.worker_uid AND o.status = 'settled' AND o.dispatched_at < p.dispatched_at)::text[] AS superseded
FROM runtime_input_preparations p
JOIN workers w ON w.uid = p.worker_uid AND w.organization_id = p.organization_id AND w.runtime_input_reference = p.reference
WHERE p.installation = @installation AND p.status = 'settled' AND p.pool_blob IS NOT NULL
  AND w.status = 'live' AND NOT w.script_collision
ORDER BY p.settled_at;

-- name: PoolBlobsOfInstallation :many
-- Every pool blob an installation's deliveries keep (takoserver nodes rotate-pool-key).
SELECT organization_id, operation_id, worker_uid::uuid AS worker_uid, material_set_id, pool_blob
FROM runtime_input_preparations
WHERE installation = @installation AND pool_blob IS NOT NULL
ORDER BY organization_id, operation_id;

-- name: PoolBlobReplace :execrows
-- A blob sealed again to the pool's new key, in place of the one it was made from (unless the row
-- changed meanwhile: a newer delivery settled, the worker went).
UPDATE runtime_input_preparations
SET pool_blob = @sealed, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND operation_id = @operation_id AND pool_blob = @previous;
