-- name: APIKeyCreate :one
INSERT INTO api_keys (id, organization_id, secret_hash, scopes, expires_at)
VALUES (@id, @organization_id, @secret_hash, @scopes, sqlc.narg('expires_at'))
RETURNING id, organization_id, scopes, expires_at;

-- name: APIKeyRevoke :one
-- Revoking twice keeps the first revocation time.
UPDATE api_keys
SET revoked_at = coalesce(revoked_at, now())
WHERE id = @id
RETURNING id, organization_id, revoked_at;

-- name: APIKeyAuthenticate :one
-- Revoked and expired keys never match, so revocation takes effect on the next request. The
-- key's last use is written in the same statement, at most once a minute.
WITH k AS (
    SELECT k.id, k.organization_id, o.name AS organization_name, k.scopes, k.last_used_at
    FROM api_keys k
    JOIN organizations o ON o.id = k.organization_id
    WHERE k.secret_hash = @secret_hash
      AND k.revoked_at IS NULL
      AND (k.expires_at IS NULL OR k.expires_at > (SELECT db_now()))
), touched AS (
    UPDATE api_keys a SET last_used_at = (SELECT db_now())
    FROM k
    WHERE a.id = k.id AND (k.last_used_at IS NULL OR k.last_used_at < (SELECT db_now()) - interval '1 minute')
)
SELECT k.id, k.organization_id, k.organization_name, k.scopes FROM k;

-- name: APIKeyList :many
-- Every key, or one organization's, without its secret's hash: for keys list.
SELECT k.id, o.name AS organization_name, k.scopes, k.created_at, k.revoked_at, k.expires_at, k.last_used_at
FROM api_keys k
JOIN organizations o ON o.id = k.organization_id
WHERE sqlc.narg('organization')::text IS NULL OR o.name = sqlc.narg('organization')::text
ORDER BY o.name, k.created_at, k.id;
