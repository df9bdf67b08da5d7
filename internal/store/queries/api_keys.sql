-- name: APIKeyCreate :one
INSERT INTO api_keys (id, organization_id, secret_hash, scopes)
VALUES (@id, @organization_id, @secret_hash, @scopes)
RETURNING id, organization_id, scopes;

-- name: APIKeyRevoke :one
-- Revoking twice keeps the first revocation time.
UPDATE api_keys
SET revoked_at = coalesce(revoked_at, now())
WHERE id = @id
RETURNING id, organization_id, revoked_at;

-- name: APIKeyAuthenticate :one
-- Revoked keys never match, so revocation takes effect on the next request.
SELECT k.id, k.organization_id, o.name AS organization_name, k.scopes
FROM api_keys k
JOIN organizations o ON o.id = k.organization_id
WHERE k.secret_hash = @secret_hash
  AND k.revoked_at IS NULL;
