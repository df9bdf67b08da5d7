-- name: RuntimeNodes :many
-- The members of an installation's pool, in the order they were added.
SELECT installation, name, url, state, pool_epoch, added_at, changed_at, fenced_since
FROM runtime_nodes
WHERE installation = @installation
ORDER BY added_at, name;

-- name: RuntimeNodesAsOf :many
-- The members of an installation's pool with the database's time of the read and the pool's
-- recorded fence (-1: not recorded yet, the catalog's), for the backend.
SELECT name, url, state, pool_epoch, added_at, changed_at, (SELECT db_now())::timestamptz AS as_of,
       coalesce((SELECT p.fence_seconds FROM runtime_pools p WHERE p.installation = @installation), -1)::integer AS pool_fence_seconds
FROM runtime_nodes
WHERE installation = @installation
ORDER BY added_at, name;

-- name: RuntimeNodesLock :exec
-- Serializes changes of one pool's membership: every node command takes it first.
SELECT pg_advisory_xact_lock(hashtextextended(@lock_key::text, 0));

-- name: RuntimeNodesShareLock :exec
-- Held by a transaction that plans effects on the pool's members: a node command (which takes
-- RuntimeNodesLock) waits for it, so that no member is removed while an effect planned on it is
-- being committed.
SELECT pg_advisory_xact_lock_shared(hashtextextended(@lock_key::text, 0));

-- name: RuntimeNodeInsert :one
-- added_at: now, or, for the catalog's node written when a pool gets its first row, the time it
-- has been a member since (before any replica read the pool).
INSERT INTO runtime_nodes (installation, name, url, state, pool_epoch, added_at, changed_at)
VALUES (@installation, @name, @url, @state,
        coalesce((SELECT max(pool_epoch) FROM runtime_nodes WHERE installation = @installation), 1),
        coalesce(sqlc.narg(added_at)::timestamptz, db_now()), db_now())
RETURNING installation, name, url, state, pool_epoch, added_at, changed_at, fenced_since;

-- name: RuntimeNodeServe :execrows
-- A joining member caught up serves, once it joined long enough ago (settle_seconds, by the
-- database's clock) that every replica's read of the pool writes every change to it.
UPDATE runtime_nodes SET state = 'serving', changed_at = db_now()
WHERE installation = @installation AND name = @name AND state = 'joining'
  AND added_at <= db_now() - make_interval(secs => sqlc.arg('settle_seconds')::double precision);

-- name: RuntimeNodeDrain :one
-- A member that may route starts leaving the pool.
UPDATE runtime_nodes SET state = 'draining', changed_at = db_now(), pool_epoch = pool_epoch + 1
WHERE installation = @installation AND name = @name AND state IN ('joining', 'serving')
RETURNING installation, name, url, state, pool_epoch, added_at, changed_at, fenced_since;

-- name: RuntimeNodeRemove :one
-- A drained member that confirmed it holds nothing leaves the pool: draining for at least
-- fence_seconds by the database's clock, and no running operation has an effect on it still in
-- flight (one that planned a write to it, read in this same statement: SPEC 6.2).
UPDATE runtime_nodes n SET state = 'removed', changed_at = db_now(), pool_epoch = pool_epoch + 1
WHERE n.installation = sqlc.arg(installation) AND n.name = sqlc.arg(name) AND n.state = 'draining'
  AND n.changed_at + make_interval(secs => sqlc.arg(fence_seconds)::double precision) <= db_now()
  AND NOT EXISTS (SELECT 1 FROM backend_effects c
                  JOIN operations o ON o.id = c.operation_id
                  JOIN deployments d ON d.id = c.deployment_id
                  WHERE c.node = n.name AND d.installation = n.installation
                    AND c.status IN ('planned', 'dispatched') AND o.status = 'running')
RETURNING n.installation, n.name, n.url, n.state, n.pool_epoch, n.added_at, n.changed_at, n.fenced_since;

-- name: RuntimeNodeEffectsInFlight :one
-- How many effects of running operations are in flight on the member.
SELECT count(*)::bigint AS effects
FROM backend_effects c
JOIN operations o ON o.id = c.operation_id
JOIN deployments d ON d.id = c.deployment_id
WHERE c.node = @name::text AND d.installation = @installation::text
  AND c.status IN ('planned', 'dispatched') AND o.status = 'running';

-- name: RuntimeNodeRetire :one
-- Retires a member the operator attests lost: fenced since fenced_since, which is at least
-- fence_seconds ago by the database's clock. The caller moves the other members' epoch on
-- (RuntimeNodesBumpEpoch) in the same transaction.
UPDATE runtime_nodes
SET state = 'retired', fenced_since = sqlc.arg(fenced_since)::timestamptz, changed_at = db_now(), pool_epoch = pool_epoch + 1
WHERE installation = sqlc.arg(installation) AND name = sqlc.arg(name) AND state NOT IN ('removed', 'retired')
  AND sqlc.arg(fenced_since)::timestamptz + make_interval(secs => sqlc.arg(fence_seconds)::double precision) <= db_now()
RETURNING installation, name, url, state, pool_epoch, added_at, changed_at, fenced_since;

-- name: RuntimeNodesBumpEpoch :exec
UPDATE runtime_nodes SET pool_epoch = pool_epoch + 1
WHERE installation = @installation AND name <> @name;

-- name: RuntimeNodeEvent :exec
INSERT INTO runtime_node_events (installation, node, action, actor, at, detail)
VALUES (@installation, @node, @action, @actor, db_now(), @detail);

-- name: RuntimeNodeEvents :many
SELECT id, installation, node, action, actor, at, detail
FROM runtime_node_events
WHERE installation = @installation
ORDER BY id;

-- name: DBNow :one
SELECT db_now()::timestamptz AS now;

-- name: OfferingDigestMove :one
-- Rewrites a selfhost offering's digest from before pools (it covered runtimeUrl) to the pool's
-- (SPEC 6.2), in every row that records a placement. Run at each Host start; a row already
-- rewritten, or of another digest, is left as it is.
WITH r AS (
    UPDATE worker_endpoint_origin_reservations SET offering_digest = sqlc.arg(digest)::text
    WHERE offering_id = sqlc.arg(offering_id)::text AND offering_digest = sqlc.arg(legacy)::text RETURNING 1
), w AS (
    UPDATE workers SET offering_digest = sqlc.arg(digest)::text
    WHERE offering_id = sqlc.arg(offering_id)::text AND offering_digest = sqlc.arg(legacy)::text RETURNING 1
), e AS (
    UPDATE worker_endpoints SET offering_digest = sqlc.arg(digest)::text
    WHERE offering_id = sqlc.arg(offering_id)::text AND offering_digest = sqlc.arg(legacy)::text RETURNING 1
), d AS (
    UPDATE deployments SET offering_digest = sqlc.arg(digest)::text
    WHERE offering_id = sqlc.arg(offering_id)::text AND offering_digest = sqlc.arg(legacy)::text RETURNING 1
), p AS (
    UPDATE runtime_input_preparations SET offering_digest = sqlc.arg(digest)::text
    WHERE offering_id = sqlc.arg(offering_id)::text AND offering_digest = sqlc.arg(legacy)::text RETURNING 1
)
SELECT ((SELECT count(*) FROM r) + (SELECT count(*) FROM w) + (SELECT count(*) FROM e)
        + (SELECT count(*) FROM d) + (SELECT count(*) FROM p))::bigint AS moved;

-- name: WorkersWithoutPoolBlob :one
-- How many live workers of an installation hold, as their newest settled delivery, one the Host
-- kept no pool blob of (delivered before the pool key was set): a node joining the pool cannot
-- get their secrets, and they read not Ready there until their runtime input is delivered again.
SELECT count(DISTINCT p.worker_uid)::bigint AS workers
FROM runtime_input_preparations p
JOIN workers w ON w.uid = p.worker_uid
WHERE w.installation = @installation AND w.status = 'live' AND p.status = 'settled' AND p.pool_blob IS NULL
  AND NOT EXISTS (SELECT 1 FROM runtime_input_preparations n
                  WHERE n.worker_uid = p.worker_uid AND n.status = 'settled' AND n.dispatched_at > p.dispatched_at);

-- name: RuntimePoolFenceRecord :one
-- The pool's fence, recorded from the catalog (catalog_fence_seconds) when the pool has none yet.
WITH ins AS (
    INSERT INTO runtime_pools (installation, fence_seconds, changed_at, changed_by)
    VALUES (@installation, @catalog_fence_seconds::integer, db_now(), 'catalog')
    ON CONFLICT (installation) DO NOTHING
    RETURNING fence_seconds
)
SELECT coalesce((SELECT fence_seconds FROM ins), (SELECT p.fence_seconds FROM runtime_pools p WHERE p.installation = @installation))::integer AS fence_seconds;

-- name: RuntimePoolFence :one
-- The pool's recorded fence (-1: not recorded yet).
SELECT coalesce((SELECT p.fence_seconds FROM runtime_pools p WHERE p.installation = @installation), -1)::integer AS fence_seconds;

-- name: RuntimePoolFenceSet :exec
INSERT INTO runtime_pools (installation, fence_seconds, changed_at, changed_by)
VALUES (@installation, @fence_seconds::integer, db_now(), @changed_by)
ON CONFLICT (installation) DO UPDATE SET fence_seconds = excluded.fence_seconds, changed_at = excluded.changed_at, changed_by = excluded.changed_by;
