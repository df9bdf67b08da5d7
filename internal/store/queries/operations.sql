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
