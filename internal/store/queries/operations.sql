-- name: OperationBegin
INSERT INTO operations (id, organization_id, kind, external_key, method, status)
VALUES (@id, @organization_id, @kind, @external_key, @method, 'running');

-- name: OperationFinish
-- running -> committed | refused, once.
UPDATE operations
SET status = @status, code = @code, replayed = @replayed, finished_at = now()
WHERE id = @id AND status = 'running';

-- name: OperationGet
SELECT id, kind, external_key, method, status, code, replayed, started_at, finished_at
FROM operations
WHERE id = @id AND organization_id = @organization_id;

-- name: OperationEffects
SELECT e.id, e.deployment_id, d.resource_kind, d.resource_uid, e.action, e.status, e.detail
FROM backend_effects e
JOIN deployments d ON d.id = e.deployment_id
WHERE e.operation_id = @operation_id
ORDER BY e.created_at, e.id;

-- name: OperationsRunningForKey
-- Operations still marked running on a key. Whoever holds the key's lock is the only request on
-- it, so any other running operation there belongs to a Host that stopped mid-request.
SELECT id FROM operations
WHERE organization_id = @organization_id AND kind = @kind AND external_key = @external_key
  AND status = 'running' AND id <> @id
ORDER BY started_at;

-- name: OperationsStale
-- Running operations older than the threshold: candidates for recovery when their key's lock is
-- free (their Host is gone).
SELECT id, organization_id, kind, external_key FROM operations
WHERE status = 'running' AND started_at < now() - make_interval(secs => @older_than_seconds::double precision)
ORDER BY started_at
LIMIT 100;

-- name: OperationUnsettledEffects
-- The effects of an operation that never reached a terminal status, with what recovery needs to
-- read the backend back.
SELECT e.id, e.action, e.status, d.id, d.status, d.resource_kind, d.resource_uid, d.native_name, d.installation
FROM backend_effects e
JOIN deployments d ON d.id = e.deployment_id
WHERE e.operation_id = @operation_id AND e.status IN ('planned', 'dispatched')
ORDER BY e.created_at, e.id
FOR UPDATE OF e, d;

-- name: OperationAbandon
UPDATE operations SET status = 'refused', code = 'abandoned', finished_at = now()
WHERE id = @id AND status = 'running';
