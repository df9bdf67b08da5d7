-- name: ReconcileKnown :many
-- Which of the deployments a node holds the ledger knows, with what it says of them: the
-- deployment's status, whether its worker or endpoint is deleted, and whether a running operation
-- is working on it. A deployment is recorded before any backend is asked to hold it, so one a
-- node holds that is not here was written by a ledger this database no longer has.
SELECT d.id, d.status, d.resource_kind, d.resource_uid,
       (EXISTS (SELECT 1 FROM workers w WHERE w.uid = d.resource_uid AND w.status = 'deleted')
        OR EXISTS (SELECT 1 FROM worker_endpoints e WHERE e.uid = d.resource_uid AND e.status = 'deleted'))::boolean AS resource_deleted,
       EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
               WHERE x.deployment_id = d.id AND o.status = 'running')::boolean AS in_flight
FROM deployments d
WHERE d.id = ANY (@ids::uuid[]);

-- name: ReconcileCurrent :many
-- What the ledger says an installation's node must hold: each live worker's current generation
-- and each live endpoint's route, where that deployment is active and no other deployment of the
-- same worker or endpoint is open (an operation working on it writes the node itself).
SELECT d.id, d.resource_kind, d.resource_uid, d.native_name, d.seq, d.route_script
FROM deployments d
WHERE d.installation = @installation AND d.status = 'active'
  AND (EXISTS (SELECT 1 FROM workers w
               WHERE w.uid = d.resource_uid AND w.status = 'live' AND NOT w.script_collision
                 AND (w.generation = d.generation OR EXISTS (SELECT 1 FROM worker_kept_bundles k WHERE k.deployment_id = d.id)))
       OR EXISTS (SELECT 1 FROM worker_endpoints e WHERE e.uid = d.resource_uid AND e.status = 'live'))
  AND NOT EXISTS (SELECT 1 FROM deployments o
                  WHERE o.resource_uid = d.resource_uid AND o.id <> d.id AND o.status IN ('pending', 'deleting'))
ORDER BY d.seq;

-- name: ReconcileLockWorker :one
-- The worker whose deployment the reconciler writes again, locked until that write is done: an
-- update or a delete of the worker locks its row first, so it waits, and one that planned first
-- is seen here (a deployment open beside this one, or the worker no longer live): then no row.
-- The deployment takes the next generation (seq), past whatever the node moved its name to.
WITH w AS (
    SELECT w.uid, w.organization_id, w.space, w.name,
           coalesce(k.modules, w.modules) AS modules, coalesce(k.main_module, w.main_module) AS main_module,
           coalesce(k.compatibility_date, w.compatibility_date) AS compatibility_date, coalesce(k.settings, w.settings) AS settings,
           coalesce(k.required_sensitive_vars, w.required_sensitive_vars) AS required_sensitive_vars, w.script_name
    FROM workers w
    LEFT JOIN worker_kept_bundles k ON k.deployment_id = @deployment_id AND k.worker_uid = w.uid
    WHERE w.uid = @uid AND w.status = 'live' AND NOT w.script_collision
      AND EXISTS (SELECT 1 FROM deployments d
                  WHERE d.id = @deployment_id AND d.resource_uid = w.uid AND d.status = 'active'
                    AND (d.generation = w.generation OR k.deployment_id IS NOT NULL))
      AND NOT EXISTS (SELECT 1 FROM deployments d
                      WHERE d.resource_uid = w.uid AND d.id <> @deployment_id AND d.status IN ('pending', 'deleting'))
    FOR UPDATE OF w
), moved AS (
    UPDATE deployments SET seq = nextval(pg_get_serial_sequence('deployments', 'seq'))
    WHERE id = @deployment_id AND EXISTS (SELECT 1 FROM w)
    RETURNING seq
)
SELECT w.uid, w.space, w.name, w.modules, w.main_module, w.compatibility_date, w.settings, w.required_sensitive_vars,
       w.script_name, o.name AS organization_name, moved.seq
FROM w JOIN organizations o ON o.id = w.organization_id, moved;

-- name: ReconcileLockEndpoint :one
-- The endpoint whose route the reconciler writes again, locked until that write is done (its
-- delete locks the row before it marks it deleting); no row when it is no longer live with this
-- route active.
SELECT e.uid, e.space, e.worker_name, o.name AS organization_name
FROM worker_endpoints e JOIN organizations o ON o.id = e.organization_id
WHERE e.uid = @uid AND e.status = 'live'
  AND EXISTS (SELECT 1 FROM deployments d WHERE d.id = @deployment_id AND d.resource_uid = e.uid AND d.status = 'active')
  AND NOT EXISTS (SELECT 1 FROM deployments d
                  WHERE d.resource_uid = e.uid AND d.id <> @deployment_id AND d.status IN ('pending', 'deleting'))
FOR UPDATE OF e;

-- name: DeploymentSequenceAdvance :exec
-- Moves the deployments' generations past floor, the highest a node has seen: after a database
-- restore to an earlier point, the sequence would otherwise hand out generations the node
-- refuses as stale.
SELECT setval(pg_get_serial_sequence('deployments', 'seq'), @floor::bigint)
WHERE @floor::bigint > COALESCE(pg_sequence_last_value(pg_get_serial_sequence('deployments', 'seq')::regclass), 0);

-- name: NodeReconciliationRecord :exec
INSERT INTO node_reconciliations (id, installation, native_kind, native_name, action, deployment_id, resource_uid, organization, generation, detail, at)
VALUES (@id, @installation, @native_kind, @native_name, @action, @deployment_id, @resource_uid, @organization, @generation, @detail, (SELECT db_now()));
