-- name: OperationBegin :exec
INSERT INTO operations (id, organization_id, kind, external_key, method, status, started_at, request_digest)
VALUES (@id, @organization_id, @kind, @external_key, @method, 'running', (SELECT db_now()), @request_digest);

-- name: OperationAbandonedAttempt :one
-- Whether operation id is an abandoned attempt (its Host stopped, recovery settled it) of the
-- request whose digest is request_digest: its retry goes on from the revision the attempt made.
SELECT EXISTS (SELECT 1 FROM operations
               WHERE id = @id AND organization_id = @organization_id AND status = 'refused' AND code = 'abandoned'
                 AND request_digest = @request_digest)::boolean AS abandoned;

-- name: OperationRecord :exec
-- An operation that began and ended in one transaction (or was refused before it began): recorded
-- at once with its outcome.
INSERT INTO operations (id, organization_id, kind, external_key, method, status, code, replayed, started_at, finished_at)
VALUES (@id, @organization_id, @kind, @external_key, @method, @status, sqlc.narg('code'), false, (SELECT db_now()), (SELECT db_now()));

-- name: OperationFinish :execrows
-- running -> committed | refused, once.
UPDATE operations
SET status = @status, code = sqlc.narg('code'), finished_at = (SELECT db_now())
WHERE id = @id AND status = 'running';

-- name: OperationGet :one
SELECT id, kind, external_key, method, status, code, replayed, started_at, finished_at
FROM operations
WHERE id = @id AND organization_id = @organization_id;

-- name: OperationEffects :many
-- (Each effect's one deployment by its key: LIMIT 1 keeps the planner from joining the whole
-- table when it cannot tell how few effects an operation has.)
SELECT e.id, e.deployment_id, d.resource_kind, d.resource_uid, e.action, e.status, e.detail, e.node
FROM backend_effects e
CROSS JOIN LATERAL (SELECT x.resource_kind, x.resource_uid FROM deployments x WHERE x.id = e.deployment_id LIMIT 1) d
WHERE e.operation_id = @operation_id
-- each member's effect after its pack's effect (those planned with it right after it)
ORDER BY e.created_at, coalesce(e.parent_id, e.id), e.parent_id NULLS FIRST, e.node;

-- name: OperationUnsettledEffects :many
-- The effects of an interrupted operation that never reached a terminal status, with what
-- recovery needs to read the backend back. Read outside any backend call; settled afterwards by
-- compare-and-swap on the effect's status.
SELECT e.id AS effect_id, e.action, d.id AS deployment_id, d.status AS deployment_status, d.resource_kind,
       d.resource_uid, d.generation, d.seq, d.route_script, d.native_name, d.installation
FROM backend_effects e
JOIN deployments d ON d.id = e.deployment_id
WHERE e.operation_id = @operation_id AND e.status IN ('planned', 'dispatched') AND e.parent_id IS NULL
ORDER BY e.created_at, e.id;
