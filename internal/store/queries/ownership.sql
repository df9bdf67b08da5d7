-- name: OwnershipLockKey
-- Serializes every request for one (organization, kind, external key) across all Host processes
-- for the rest of the transaction (SPEC 3.2: concurrent requests with one token serialize).
SELECT pg_advisory_xact_lock(hashtextextended(@lock_key::text, 0));

-- name: OwnershipBindingGet
SELECT token, request_hash, object_uid, response_status, response_body
FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key;

-- name: OwnershipBindingTokens
-- The tokens of many objects of one kind, for list and get projections.
SELECT external_key, token
FROM ownership_bindings
WHERE organization_id = @organization_id AND kind = @kind AND external_key = ANY (@external_keys::text[]);

-- name: OwnershipBindingUpsert
INSERT INTO ownership_bindings (organization_id, kind, external_key, token, request_hash, object_uid, response_status, response_body)
VALUES (@organization_id, @kind, @external_key, @token, @request_hash, @object_uid, @response_status, @response_body)
ON CONFLICT (organization_id, kind, external_key) DO UPDATE
SET token = excluded.token,
    request_hash = excluded.request_hash,
    object_uid = excluded.object_uid,
    response_status = excluded.response_status,
    response_body = excluded.response_body,
    updated_at = now();

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
