-- name: OwnershipTryLock
-- Serializes every request for one (organization, kind, external key) across all Host processes
-- (SPEC 3.2: concurrent requests with one token serialize). Session-level, so that a request may
-- commit several transactions under it; a crashed Host's session ends and frees it.
SELECT pg_try_advisory_lock(hashtextextended(@lock_key::text, 0));

-- name: OwnershipUnlock
SELECT pg_advisory_unlock(hashtextextended(@lock_key::text, 0));

-- name: OwnershipBindingGet
SELECT token, request_hash, object_uid, state, response_status, response_body
FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key;

-- name: OwnershipBindingTokens
-- The tokens of many objects of one kind, for list and get projections.
SELECT external_key, token
FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = ANY (@external_keys::text[]);

-- name: OwnershipBindingPending
-- Binds the token to the object before its effect has finished, in the transaction that creates
-- the object's rows.
INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, state)
VALUES (@organization_id, @kind, @external_key, @token, @request_hash, @object_uid, 'pending')
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET request_hash = excluded.request_hash,
    object_uid = excluded.object_uid,
    state = 'pending',
    response_status = NULL,
    response_body = NULL,
    updated_at = now()
WHERE ownership_bindings.token = excluded.token;

-- name: OwnershipBindingComplete
INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, state, response_status, response_body)
VALUES (@organization_id, @kind, @external_key, @token, @request_hash, @object_uid, 'complete', @response_status, @response_body)
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET request_hash = excluded.request_hash,
    object_uid = excluded.object_uid,
    state = 'complete',
    response_status = excluded.response_status,
    response_body = excluded.response_body,
    updated_at = now()
WHERE ownership_bindings.token = excluded.token;

-- name: OwnershipBindingDelete
DELETE FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key;

-- name: OwnershipTombstoneGet
SELECT object_uid, request_hash, response_status, response_body
FROM ownership_tombstones
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key AND token = @token
  AND expires_at > now();

-- name: OwnershipTombstoneCreate
INSERT INTO ownership_tombstones (organization_id, kind, external_key, token, object_uid, request_hash, response_status, response_body, expires_at)
VALUES (@organization_id, @kind, @external_key, @token, @object_uid, @request_hash, @response_status, @response_body,
        now() + make_interval(secs => @retention_seconds::bigint))
ON CONFLICT (organization_id, kind, external_key, token) DO UPDATE
SET object_uid = excluded.object_uid,
    request_hash = excluded.request_hash,
    response_status = excluded.response_status,
    response_body = excluded.response_body,
    deleted_at = now(),
    expires_at = excluded.expires_at;

-- name: OwnershipTombstonePurge
DELETE FROM ownership_tombstones
WHERE expires_at <= now();
