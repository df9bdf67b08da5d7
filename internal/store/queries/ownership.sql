-- name: OwnershipLock :many
-- The lock step of an owned mutation (the ownership_lock function of migration 19): the key's
-- advisory lock, then its binding, this token's tombstone and any in-flight lease, read under it.
-- With try_only, the first read of every owned request (SPEC 3.2): when another request holds the
-- lock, a 'busy' entry with the binding and tombstone read without it, from which a replay of a
-- finished request is answered without waiting on or taking anything.
SELECT l.entry::text AS entry, l.token::text AS token, l.request_hash::bytea AS request_hash, l.uid::uuid AS uid,
       l.status::integer AS status, l.body::bytea AS body
FROM ownership_lock(@organization_id::text, @kind::text, @external_key::text, @token::text, @lock_wait::text,
                    sqlc.narg('brake_space')::text, sqlc.narg('brake_worker')::text, @try_only::boolean) AS l;

-- name: OwnershipIntentAcquire :exec
-- Takes the key's in-flight lease for a request whose effect spans several transactions. The
-- caller holds the key lock and has seen no live lease; an expired one is taken over here.
INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at)
VALUES (@organization_id, @kind, @external_key, @operation_id, @holder, (SELECT db_now()) + make_interval(secs => @lease_seconds::double precision))
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET operation_id = excluded.operation_id, holder = excluded.holder, lease_expires_at = excluded.lease_expires_at;

-- name: OwnershipIntentHeld :one
-- Proves, at the start of each later phase, that this request still holds its lease, and locks
-- the lease row for the phase so that no takeover can interleave with it. No row: the lease was
-- lost (it expired and someone recovered the operation).
SELECT operation_id FROM ownership_intents
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key
  AND operation_id = @operation_id
FOR UPDATE;

-- name: OwnershipIntentRenew :execrows
UPDATE ownership_intents
SET lease_expires_at = (SELECT db_now()) + make_interval(secs => @lease_seconds::double precision)
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key
  AND operation_id = @operation_id;

-- name: OwnershipIntentRelease :exec
DELETE FROM ownership_intents
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key
  AND operation_id = @operation_id;

-- name: OwnershipIntentsExpired :many
-- Leases whose Host stopped renewing them: their operations wait for recovery.
SELECT organization_id, kind, external_key, operation_id
FROM ownership_intents
WHERE lease_expires_at <= (SELECT db_now())
ORDER BY lease_expires_at
LIMIT 100;

-- name: OwnershipBind :exec
-- Binds the token to the object with the committed outcome's response, in the transaction that
-- commits it (SPEC 3.2: only committed outcomes are bound and stored).
INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
VALUES (@organization_id, @kind, @external_key, @token, @request_hash, @object_uid, @response_status, @response_body)
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET request_hash = excluded.request_hash, object_uid = excluded.object_uid,
    response_status = excluded.response_status, response_body = excluded.response_body, updated_at = now()
WHERE ownership_bindings.token = excluded.token;

-- name: OwnershipUnbind :exec
DELETE FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key;

-- name: OwnershipTombstoneCreate :exec
INSERT INTO ownership_tombstones (organization_id, kind, external_key, token, object_uid, request_hash, response_status, response_body, deleted_at, expires_at)
VALUES (@organization_id, @kind, @external_key, @token, @object_uid, @request_hash, @response_status, @response_body,
        (SELECT db_now()), (SELECT db_now()) + make_interval(secs => @retention_seconds::double precision))
ON CONFLICT (organization_id, kind, external_key, token) DO UPDATE
SET object_uid = excluded.object_uid, request_hash = excluded.request_hash, response_status = excluded.response_status,
    response_body = excluded.response_body, deleted_at = excluded.deleted_at, expires_at = excluded.expires_at;

-- name: OwnershipTombstonePurge :execrows
DELETE FROM ownership_tombstones WHERE expires_at <= (SELECT db_now());

-- name: OwnershipIntentExpire :exec
-- A recovery that could not finish gives the lease back already expired, so that the next request
-- on the key, or the janitor, tries again.
UPDATE ownership_intents SET lease_expires_at = (SELECT db_now())
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key
  AND operation_id = @operation_id;

-- name: OwnershipCommitBinding :exec
-- The committed outcome of a PUT, in one statement: the operation recorded committed (inserted,
-- for a request that was one transaction from the start; finished, with its lease released, for
-- one that held a lease) and the token bound to the object with the stored response.
WITH t AS MATERIALIZED (SELECT db_now() AS at), -- the time, read once (not folded into each use)
recorded AS (
    INSERT INTO operations (id, organization_id, kind, external_key, method, status, replayed, started_at, finished_at)
    SELECT @operation_id, @organization_id, @kind, @external_key, @method, 'committed', false, t.at, t.at
    FROM t
    WHERE NOT @leased::boolean
), finished AS (
    UPDATE operations SET status = 'committed', finished_at = (SELECT t.at FROM t)
    WHERE @leased::boolean AND id = @operation_id AND status = 'running'
), released AS (
    DELETE FROM ownership_intents
    WHERE @leased::boolean AND organization_id = @organization_id AND kind = @kind AND external_key = @external_key
      AND operation_id = @operation_id
)
INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
VALUES (@organization_id, @kind, @external_key, @token, @request_hash, @object_uid, @response_status, @response_body)
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET request_hash = excluded.request_hash, object_uid = excluded.object_uid,
    response_status = excluded.response_status, response_body = excluded.response_body, updated_at = now()
WHERE ownership_bindings.token = excluded.token;

-- name: OwnershipLeaseCounts :one
-- The requests in flight by the state of their leases, for the Host's metrics: live ones are being
-- worked on; expired ones belong to a Host that stopped, until a request or the janitor recovers them.
SELECT count(*) FILTER (WHERE lease_expires_at > (SELECT db_now()))::bigint AS live,
       count(*) FILTER (WHERE lease_expires_at <= (SELECT db_now()))::bigint AS expired
FROM ownership_intents;
