-- name: SealingKeysOpenable :many
-- The keys that may still open something: the current one and the bounded previous ones.
SELECT id, status, kek_id, wrapped_key FROM sealing_keys
WHERE status IN ('current', 'previous')
ORDER BY created_at DESC, id;

-- name: SealingKeyCurrentID :one
SELECT id FROM sealing_keys WHERE status = 'current';

-- name: SealingKeyInit :execrows
-- The first data key of a database, wrapped by the first Host's key-encryption key. A database
-- that already has a current key keeps it.
INSERT INTO sealing_keys (id, status, kek_id, wrapped_key)
VALUES (@id, 'current', @kek_id, @wrapped_key)
ON CONFLICT DO NOTHING;

-- name: SealingKeyRotate :one
-- Rotation is one write (SPEC 3.5): the new key becomes current, the old current becomes
-- previous, and previous keys beyond the bound are retired, their material destroyed. Every
-- replica sees the new key on its next seal. It is a compare-and-swap on the key-encryption key:
-- only a current key wrapped by @kek_id is demoted, and nothing else is written otherwise, so a
-- rotation racing a re-wrap (keys rewrap) never leaves a new key under the key-encryption key
-- being retired (demoted_count 0).
WITH demoted AS (
    UPDATE sealing_keys SET status = 'previous' WHERE status = 'current' AND sealing_keys.kek_id = @kek_id::text RETURNING id, created_at
), ranked AS (
    SELECT id, row_number() OVER (ORDER BY created_at DESC, id DESC) AS n
    FROM (SELECT id, created_at FROM sealing_keys WHERE status = 'previous'
          UNION SELECT id, created_at FROM demoted) k
), retired AS (
    UPDATE sealing_keys s SET status = 'retired', wrapped_key = NULL, retired_at = (SELECT db_now())
    FROM ranked WHERE s.id = ranked.id AND ranked.n > @max_previous::integer AND EXISTS (SELECT 1 FROM demoted)
    RETURNING s.id
), inserted AS (
    INSERT INTO sealing_keys (id, status, kek_id, wrapped_key)
    SELECT @id, 'current', @kek_id, @wrapped_key WHERE EXISTS (SELECT 1 FROM demoted)
    RETURNING id
)
SELECT (SELECT count(*) FROM retired)::integer AS retired_count, (SELECT count(*) FROM ranked)::integer AS previous_count,
       (SELECT count(*) FROM demoted)::integer AS demoted_count;

-- name: CommitmentSecretInit :execrows
-- The first runtime-input commitment secret of a database (SPEC 3.5, rip2). A database that already
-- has a current one keeps it.
INSERT INTO runtime_input_commitment_secrets (id, kek_id, wrapped_secret)
VALUES (@id, @kek_id, @wrapped_secret)
ON CONFLICT DO NOTHING;

-- name: CommitmentSecretCurrent :one
SELECT id, kek_id, wrapped_secret FROM runtime_input_commitment_secrets WHERE current;

-- name: CommitmentSecretGet :one
SELECT id, kek_id, wrapped_secret FROM runtime_input_commitment_secrets WHERE id = @id;

-- name: SealingKeysForRewrap :many
-- Every data key that still has material, locked for a re-wrap under another key-encryption key.
SELECT id, kek_id, wrapped_key FROM sealing_keys WHERE wrapped_key IS NOT NULL ORDER BY id FOR UPDATE;

-- name: SealingKeyRewrap :exec
UPDATE sealing_keys SET kek_id = @kek_id, wrapped_key = @wrapped_key WHERE id = @id;

-- name: CommitmentSecretsForRewrap :many
-- Every runtime-input commitment secret, locked for a re-wrap under another key-encryption key.
SELECT id, kek_id, wrapped_secret FROM runtime_input_commitment_secrets ORDER BY id FOR UPDATE;

-- name: CommitmentSecretRewrap :exec
UPDATE runtime_input_commitment_secrets SET kek_id = @kek_id, wrapped_secret = @wrapped_secret WHERE id = @id;

-- name: HostSecretInit :execrows
-- A Host secret that never rotates (the custom-domain challenge secret): the first replica to start
-- creates it, and every later one keeps it.
INSERT INTO host_secrets (name, kek_id, wrapped_secret)
VALUES (@name, @kek_id, @wrapped_secret)
ON CONFLICT DO NOTHING;

-- name: HostSecretGet :one
SELECT name, kek_id, wrapped_secret FROM host_secrets WHERE name = @name;

-- name: HostSecretsForRewrap :many
SELECT name, kek_id, wrapped_secret FROM host_secrets ORDER BY name FOR UPDATE;

-- name: HostSecretRewrap :exec
UPDATE host_secrets SET kek_id = @kek_id, wrapped_secret = @wrapped_secret WHERE name = @name;
