-- name: BrakeEngaged
SELECT engaged FROM brakes WHERE name = @name;

-- name: BrakeSet
UPDATE brakes SET engaged = @engaged, updated_at = now() WHERE name = @name RETURNING name, engaged;

-- name: WorkerInsert
INSERT INTO workers (uid, organization_id, space, name, modules, main_module, compatibility_date,
                     required_sensitive_vars, runtime_input_reference, script_name,
                     offering_id, offering_digest, pack, installation, status, operation_id)
VALUES (@uid, @organization_id, @space, @name, @modules, @main_module, @compatibility_date,
        @required_sensitive_vars, @runtime_input_reference, @script_name,
        @offering_id, @offering_digest, @pack, @installation, 'creating', @operation_id);

-- name: WorkerSelect
-- Readiness is derived here, on every read, from the deployment rows (SPEC 3.6): live, and the
-- current generation's deployment active.
SELECT w.uid, w.organization_id, w.space, w.name, w.generation, w.revision, w.modules, w.main_module,
       w.compatibility_date, w.required_sensitive_vars, w.runtime_input_reference, w.script_name,
       w.offering_id, w.offering_digest, w.pack, w.installation, w.status, w.operation_id,
       resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = w.uid AND d.generation = w.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '') AS deployment_status,
       (SELECT p.status FROM runtime_input_preparations p
        WHERE p.organization_id = w.organization_id AND p.reference = w.runtime_input_reference) AS runtime_input_status
FROM workers w
JOIN operations o ON o.id = w.operation_id
WHERE w.organization_id = @organization_id
  AND ((@uid::uuid IS NOT NULL AND w.uid = @uid::uuid)
       OR (@uid::uuid IS NULL AND w.space = @space AND w.name = @name AND w.status <> 'deleted'))
FOR UPDATE OF w;

-- name: WorkerUpdate
-- Compare-and-swap on revision: zero rows means someone else changed the worker.
UPDATE workers
SET generation = @generation, revision = revision + 1, modules = @modules, main_module = @main_module,
    compatibility_date = @compatibility_date, required_sensitive_vars = @required_sensitive_vars,
    runtime_input_reference = @runtime_input_reference, status = @status, operation_id = @operation_id,
    updated_at = now(), deleted_at = CASE WHEN @status = 'deleted' THEN now() END
WHERE uid = @uid AND revision = @revision
RETURNING revision;

-- name: WorkerLiveEndpoints
-- Endpoints that still stand on a worker.
SELECT e.name
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id
WHERE e.worker_uid = @worker_uid AND resource_present(e.status, o.status)
ORDER BY e.name;

-- name: EndpointInsert
INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name, origin_reservation_id,
                              host_minted, canonical_origin, hostname, offering_id, offering_digest, pack,
                              installation, status, operation_id)
VALUES (@uid, @organization_id, @space, @name, @worker_uid, @worker_name, @origin_reservation_id,
        @host_minted, @canonical_origin, @hostname, @offering_id, @offering_digest, @pack,
        @installation, 'creating', @operation_id);

-- name: EndpointSelect
SELECT e.uid, e.organization_id, e.space, e.name, e.generation, e.revision, e.worker_uid, e.worker_name,
       e.origin_reservation_id, e.host_minted, e.canonical_origin, e.hostname, e.offering_id,
       e.offering_digest, e.pack, e.installation, e.status, e.operation_id, resource_present(e.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = e.uid AND d.generation = e.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '') AS deployment_status
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id
WHERE e.organization_id = @organization_id
  AND ((@uid::uuid IS NOT NULL AND e.uid = @uid::uuid)
       OR (@uid::uuid IS NULL AND e.space = @space AND e.name = @name AND e.status <> 'deleted'))
FOR UPDATE OF e;

-- name: EndpointSetStatus
UPDATE worker_endpoints
SET status = @status, revision = revision + 1, operation_id = @operation_id, updated_at = now(),
    deleted_at = CASE WHEN @status = 'deleted' THEN now() END
WHERE uid = @uid AND revision = @revision
RETURNING revision;

-- name: DeploymentInsert
INSERT INTO deployments (id, organization_id, resource_kind, resource_uid, generation, native_name,
                         offering_id, offering_digest, pack, installation, status)
VALUES (@id, @organization_id, @resource_kind, @resource_uid, @generation, @native_name,
        @offering_id, @offering_digest, @pack, @installation, 'pending');

-- name: DeploymentsOpen
-- The deployments of a resource that a delete must take down.
SELECT id, native_name FROM deployments
WHERE resource_uid = @resource_uid AND status IN ('pending', 'active', 'deleting')
ORDER BY created_at, id;

-- name: DeploymentSetStatus
UPDATE deployments SET status = @status, updated_at = now()
WHERE id = @id AND status = ANY (@from::text[]);

-- name: DeploymentSupersede
-- A newer generation replaced the native object in place: older deployments are gone.
UPDATE deployments SET status = 'deleted', updated_at = now()
WHERE resource_uid = @resource_uid AND id <> @id AND status IN ('pending', 'active');

-- name: DeploymentActivePlacement
-- The placement of the worker's current active deployment: the only source a mint reads.
SELECT d.offering_id, d.offering_digest, d.pack, d.installation
FROM deployments d
JOIN workers w ON w.uid = d.resource_uid AND d.generation = w.generation
WHERE d.resource_uid = @resource_uid AND d.status = 'active'
ORDER BY d.created_at DESC, d.id
LIMIT 1;

-- name: EffectInsert
INSERT INTO backend_effects (id, operation_id, deployment_id, action, status)
VALUES (@id, @operation_id, @deployment_id, @action, 'planned');

-- name: EffectSetStatus
UPDATE backend_effects SET status = @status, detail = @detail, updated_at = now()
WHERE id = @id AND status = @from;

-- name: AttestationOpen
INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status, operation_id)
VALUES (@uid, @organization_id, @resource_kind, 'open', @operation_id)
ON CONFLICT (uid) DO UPDATE SET operation_id = excluded.operation_id
WHERE deletion_attestations.status = 'open';

-- name: AttestationClose
UPDATE deletion_attestations SET status = 'closed', closed_at = now()
WHERE uid = @uid AND status = 'open';

-- name: AttestationGet
SELECT uid, resource_kind, status, operation_id, opened_at, closed_at
FROM deletion_attestations
WHERE uid = @uid AND organization_id = @organization_id;

-- name: WorkerScriptName
SELECT script_name FROM workers WHERE uid = @uid;

-- name: RecoverySettleEffect
UPDATE backend_effects SET status = @status, detail = 'settled by recovery', updated_at = now()
WHERE id = @id AND status IN ('planned', 'dispatched');

-- name: RecoverySettleDeployment
UPDATE deployments SET status = @status, updated_at = now() WHERE id = @id;
