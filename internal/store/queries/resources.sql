-- name: BrakeEngaged :one
-- Whether a deployment brake covers this organization's worker (SPEC 3.6): one on the whole Host,
-- on the organization, or on this very worker.
SELECT EXISTS (
    SELECT 1 FROM deployment_brakes b
    WHERE b.organization_id IS NULL
       OR (b.organization_id = @organization_id
           AND (b.space IS NULL OR (b.space = sqlc.narg('space') AND b.worker_name = sqlc.narg('worker_name'))))
)::boolean AS engaged;

-- name: BrakeEngage :exec
INSERT INTO deployment_brakes (scope, organization_id, space, worker_name)
VALUES (@scope, sqlc.narg('organization_id'), sqlc.narg('space'), sqlc.narg('worker_name'))
ON CONFLICT (scope) DO NOTHING;

-- name: BrakeRelease :execrows
DELETE FROM deployment_brakes WHERE scope = @scope;

-- name: WorkerInsert :exec
INSERT INTO workers (uid, organization_id, space, name, modules, module_files, main_module, compatibility_date, settings,
                     required_sensitive_vars, runtime_input_reference, script_name,
                     offering_id, offering_digest, pack, installation, status, operation_id)
VALUES (@uid, @organization_id, @space, @name, @modules, @module_files, @main_module, @compatibility_date, @settings,
        @required_sensitive_vars, sqlc.narg('runtime_input_reference'), @script_name,
        @offering_id, @offering_digest, @pack, @installation, 'creating', @operation_id);

-- name: WorkerGet :one
-- A worker as reads derive it; no lock. By UID, or the one of space/name that is not deleted.
SELECT * FROM worker_states
WHERE organization_id = @organization_id
  AND ((sqlc.narg('uid')::uuid IS NOT NULL AND uid = sqlc.narg('uid')::uuid)
       OR (sqlc.narg('uid')::uuid IS NULL AND space = @space AND name = @name AND status <> 'deleted'));

-- name: WorkerRead :one
-- The present worker space/name as its GET answers it, with the owning token of its ownership
-- key, in one round trip; no lock.
SELECT sqlc.embed(v),
       COALESCE((SELECT b.token FROM ownership_bindings b
                 WHERE b.organization_id = v.organization_id AND b.kind = @ownership_kind AND b.external_key = @ownership_key), '')::text AS ownership_token
FROM worker_states v
WHERE v.organization_id = @organization_id AND v.space = @space AND v.name = @name AND v.status <> 'deleted';

-- name: WorkerLock :one
-- The worker a mutation decides on, locked for the rest of its transaction.
SELECT v.* FROM worker_states v
JOIN workers w ON w.uid = v.uid
WHERE v.organization_id = @organization_id
  AND ((sqlc.narg('uid')::uuid IS NOT NULL AND v.uid = sqlc.narg('uid')::uuid)
       OR (sqlc.narg('uid')::uuid IS NULL AND v.space = @space AND v.name = @name AND v.status <> 'deleted'))
FOR UPDATE OF w;

-- name: WorkerUpdate :one
-- Compare-and-swap on revision: no row means someone else changed the worker.
UPDATE workers
SET generation = @generation, revision = revision + 1, modules = @modules, module_files = @module_files, main_module = @main_module,
    compatibility_date = @compatibility_date, settings = @settings, required_sensitive_vars = @required_sensitive_vars,
    runtime_input_reference = sqlc.narg('runtime_input_reference'), status = @status, operation_id = @operation_id,
    updated_at = (SELECT db_now()), deleted_at = CASE WHEN @status::resource_status = 'deleted' THEN (SELECT db_now()) END
WHERE uid = @uid AND revision = @revision
RETURNING revision;

-- name: WorkerKeepActiveBundle :exec
-- Before an update moves the worker's row to a new generation: the bundle its active deployment
-- runs, kept for the node reconciler while that deployment stays active (the update may fail).
INSERT INTO worker_kept_bundles (deployment_id, worker_uid, modules, main_module, compatibility_date, settings, required_sensitive_vars)
SELECT d.id, w.uid, w.modules, w.main_module, w.compatibility_date, w.settings, w.required_sensitive_vars
FROM workers w
JOIN deployments d ON d.resource_uid = w.uid AND d.generation = w.generation AND d.status = 'active'
WHERE w.uid = @uid AND w.generation <> @generation::bigint
ON CONFLICT (deployment_id) DO NOTHING;

-- name: WorkerKeptBundlesPrune :exec
-- The kept bundles of the worker's deployments that are no longer active.
DELETE FROM worker_kept_bundles k
WHERE k.worker_uid = @worker_uid
  AND NOT EXISTS (SELECT 1 FROM deployments d WHERE d.id = k.deployment_id AND d.status = 'active');

-- name: WorkerStandingEndpoints :many
-- Endpoints that still stand on a worker: its delete waits for them (SPEC 3.3, safe order).
SELECT e.name
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id
WHERE e.worker_uid = @worker_uid AND resource_present(e.status, o.status)
ORDER BY e.name;

-- name: WorkerScriptHolderDeleted :one
-- Whether the backend's holder of a refused script name is this organization's own deleted worker
-- whose delete is not confirmed yet (a create that never committed, its compensation pending):
-- then the name frees itself, and the refusal is retryable.
SELECT EXISTS (
    SELECT 1 FROM workers w
    JOIN deployments d ON d.resource_uid = w.uid AND d.status IN ('pending', 'active', 'deleting')
    WHERE w.organization_id = @organization_id AND w.installation = @installation
      AND w.script_name = @script_name AND w.uid <> @uid AND w.status = 'deleted'
)::boolean AS pending;

-- name: WorkerScriptName :one
SELECT script_name FROM workers WHERE uid = @uid;

-- name: EndpointInsert :exec
INSERT INTO worker_endpoints (uid, organization_id, space, name, worker_uid, worker_name, origin_reservation_id,
                              host_minted, canonical_origin, hostname, offering_id, offering_digest, pack,
                              installation, status, operation_id)
VALUES (@uid, @organization_id, @space, @name, @worker_uid, @worker_name, @origin_reservation_id,
        @host_minted, @canonical_origin, @hostname, @offering_id, @offering_digest, @pack,
        @installation, 'creating', @operation_id);

-- name: EndpointGet :one
SELECT * FROM endpoint_states
WHERE organization_id = @organization_id
  AND ((sqlc.narg('uid')::uuid IS NOT NULL AND uid = sqlc.narg('uid')::uuid)
       OR (sqlc.narg('uid')::uuid IS NULL AND space = @space AND name = @name AND status <> 'deleted'));

-- name: EndpointRead :one
-- The present endpoint space/name as its GET answers it, with the owning token of its ownership
-- key, in one round trip; no lock.
SELECT sqlc.embed(v),
       COALESCE((SELECT b.token FROM ownership_bindings b
                 WHERE b.organization_id = v.organization_id AND b.kind = @ownership_kind AND b.external_key = @ownership_key), '')::text AS ownership_token
FROM endpoint_states v
WHERE v.organization_id = @organization_id AND v.space = @space AND v.name = @name AND v.status <> 'deleted';

-- name: EndpointLock :one
SELECT v.* FROM endpoint_states v
JOIN worker_endpoints e ON e.uid = v.uid
WHERE v.organization_id = @organization_id
  AND ((sqlc.narg('uid')::uuid IS NOT NULL AND v.uid = sqlc.narg('uid')::uuid)
       OR (sqlc.narg('uid')::uuid IS NULL AND v.space = @space AND v.name = @name AND v.status <> 'deleted'))
FOR UPDATE OF e;

-- name: EndpointSetStatus :one
-- Compare-and-swap on revision.
UPDATE worker_endpoints
SET status = @status, revision = revision + 1, operation_id = @operation_id, updated_at = (SELECT db_now()),
    deleted_at = CASE WHEN @status::resource_status = 'deleted' THEN (SELECT db_now()) END
WHERE uid = @uid AND revision = @revision
RETURNING revision;

-- name: ResourceAbandonCreate :execrows
-- A create that never committed never existed: its row leaves every uniqueness constraint.
UPDATE workers SET status = 'deleted', updated_at = (SELECT db_now()), deleted_at = (SELECT db_now())
WHERE uid = @uid AND status = 'creating';

-- name: EndpointAbandonCreate :execrows
UPDATE worker_endpoints SET status = 'deleted', updated_at = (SELECT db_now()), deleted_at = (SELECT db_now())
WHERE uid = @uid AND status = 'creating';

-- name: DeploymentInsert :one
INSERT INTO deployments (id, organization_id, resource_kind, resource_uid, generation, native_name,
                         offering_id, offering_digest, pack, installation, status, route_script)
VALUES (@id, @organization_id, @resource_kind, @resource_uid, @generation, @native_name,
        @offering_id, @offering_digest, @pack, @installation, 'pending', sqlc.narg('route_script'))
RETURNING seq;

-- name: DeploymentsOpen :many
-- The deployments of a resource that a delete must take down.
SELECT id, native_name, generation, seq, route_script FROM deployments
WHERE resource_uid = @resource_uid AND status IN ('pending', 'active', 'deleting')
ORDER BY created_at, id;

-- name: DeploymentSetStatus :execrows
-- from_statuses travels as text[] and is cast here: pgx encodes an array of an enum only once the
-- type is registered on the connection, and the row is found by its key either way.
UPDATE deployments SET status = @status, updated_at = (SELECT db_now())
WHERE id = @id AND status = ANY ((sqlc.arg('from_statuses')::text[])::deployment_status[]);

-- name: DeploymentRoutedUntil :exec
-- A deleted route the backend's edge may still serve for `seconds` after the readback that found
-- it gone (SPEC 8): fence deployment_live holds until then.
UPDATE deployments
SET routed_until = greatest(routed_until, (SELECT db_now()) + make_interval(secs => @seconds::double precision))
WHERE id = @id;

-- name: DeploymentSupersede :exec
-- A newer generation replaced the native object in place: older deployments are gone.
UPDATE deployments SET status = 'deleted', updated_at = (SELECT db_now())
WHERE resource_uid = @resource_uid AND id <> @id AND status IN ('pending', 'active');

-- name: DeploymentActivePlacement :one
-- The placement of the worker's current active deployment: the only source a mint reads.
SELECT d.offering_id, d.offering_digest, d.pack, d.installation
FROM deployments d
JOIN workers w ON w.uid = d.resource_uid AND d.generation = w.generation
WHERE d.resource_uid = @resource_uid AND d.status = 'active'
ORDER BY d.created_at DESC, d.id
LIMIT 1;

-- name: DeploymentsOrphaned :many
-- Open deployments of resources that no longer stand and that no running operation is working
-- on: what a create that never committed, or a refused one whose compensation failed, left on a
-- backend. The janitor takes them down so that nothing is orphaned. A worker marked as a later
-- holder of a duplicate v1 script name (SPEC 3.4) never writes that script again: its deployments
-- are taken down too (the backend's delete is conditional on its worker UID, so a script the
-- earlier holder has is left alone), and the earlier holder's next update deploys it again.
SELECT d.id, d.resource_kind, d.resource_uid, d.native_name, d.generation, d.seq, d.route_script, d.installation, d.organization_id
FROM deployments d
WHERE d.status IN ('pending', 'active', 'deleting')
  AND NOT EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                  WHERE x.deployment_id = d.id AND o.status = 'running')
  AND (   EXISTS (SELECT 1 FROM workers w WHERE w.uid = d.resource_uid AND (w.status = 'deleted' OR w.script_collision))
       OR EXISTS (SELECT 1 FROM worker_endpoints e WHERE e.uid = d.resource_uid AND e.status = 'deleted'))
ORDER BY d.updated_at
LIMIT 50;

-- name: EffectInsert :exec
INSERT INTO backend_effects (id, operation_id, deployment_id, action, status)
VALUES (@id, @operation_id, @deployment_id, @action, @status);

-- name: EffectsPlanMembers :exec
-- A deployment on a pool is one effect per member (SPEC 6.2): under the pack's effect, one for
-- each member that may route, read from the membership rows in the plan's transaction. None on an
-- installation without membership rows (a Cloudflare pack, a pool of one from before pools).
INSERT INTO backend_effects (id, operation_id, deployment_id, action, status, node, parent_id)
SELECT gen_random_uuid(), p.operation_id, p.deployment_id, p.action, p.status, n.name, p.id
FROM backend_effects p
JOIN deployments d ON d.id = p.deployment_id
JOIN runtime_nodes n ON n.installation = d.installation AND n.state IN ('joining', 'serving', 'draining')
WHERE p.id = @parent_id AND p.parent_id IS NULL;

-- name: EffectMemberSettle :execrows
-- One member's effect ends as that member answered; a member the plan did not know (it joined
-- before the call) gets its effect recorded now.
WITH settled AS (
    UPDATE backend_effects c
    SET status = @status, detail = sqlc.narg('detail'), updated_at = (SELECT db_now())
    WHERE c.parent_id = @parent_id AND c.node = @node::text AND c.status IN ('planned', 'dispatched')
    RETURNING c.id
)
INSERT INTO backend_effects (id, operation_id, deployment_id, action, status, detail, node, parent_id)
SELECT gen_random_uuid(), p.operation_id, p.deployment_id, p.action, @status, sqlc.narg('detail'), @node::text, p.id
FROM backend_effects p
WHERE p.id = @parent_id AND NOT EXISTS (SELECT 1 FROM settled)
ON CONFLICT DO NOTHING;

-- name: EffectMembersUnsettled :exec
-- The members' effects the pack's read did not answer for end as status (failed, or unobservable).
UPDATE backend_effects
SET status = @status, detail = sqlc.narg('detail'), updated_at = (SELECT db_now())
WHERE parent_id = @parent_id::uuid AND status IN ('planned', 'dispatched');

-- name: DeploymentDeletedEverywhere :one
-- A deployment whose delete effect confirmed absence is deleted, unless a member of its pool that
-- may route did not confirm it under that effect. The membership is read in this same statement as
-- the members' confirmations (SPEC 6.2): a member another replica added while the delete ran, or
-- one the pack's cached read of the pool missed, holds the deletion (and its attestation) open.
-- deleted: the deployment is deleted now (by this statement or before it).
WITH u AS (
    UPDATE deployments d SET status = 'deleted', updated_at = (SELECT db_now())
    WHERE d.id = @id AND d.status IN ('pending', 'active', 'deleting', 'failed')
      AND NOT EXISTS (
          SELECT 1 FROM runtime_nodes n
          WHERE n.installation = d.installation AND n.state IN ('joining', 'serving', 'draining')
            AND NOT EXISTS (SELECT 1 FROM backend_effects c
                            WHERE c.parent_id = @effect_id::uuid AND c.node = n.name AND c.status = 'succeeded'))
    RETURNING 1
)
SELECT (EXISTS (SELECT 1 FROM u) OR EXISTS (SELECT 1 FROM deployments x WHERE x.id = @id AND x.status = 'deleted'))::boolean AS deleted;

-- name: ResourceMembersUnconfirmed :many
-- The members of the pool that may route and did not confirm, in operation_id, the deletion of a
-- deployment of the resource that is still open.
SELECT DISTINCT n.name::text AS name
FROM deployments d
JOIN runtime_nodes n ON n.installation = d.installation AND n.state IN ('joining', 'serving', 'draining')
WHERE d.resource_uid = @resource_uid AND d.status IN ('pending', 'active', 'deleting')
  AND NOT EXISTS (SELECT 1 FROM backend_effects c
                  WHERE c.deployment_id = d.id AND c.operation_id = @operation_id AND c.action = 'delete'
                    AND c.node = n.name AND c.status = 'succeeded')
ORDER BY 1;

-- name: EffectSetStatus :execrows
-- Compare-and-swap on the effect's status.
UPDATE backend_effects SET status = @status, detail = sqlc.narg('detail'), updated_at = (SELECT db_now())
WHERE id = @id AND status = ANY ((sqlc.arg('from_statuses')::text[])::effect_status[]);

-- name: AttestationOpen :exec
INSERT INTO deletion_attestations (uid, organization_id, resource_kind, status, operation_id, opened_at)
VALUES (@uid, @organization_id, @resource_kind, 'open', @operation_id, (SELECT db_now()))
ON CONFLICT (uid) DO UPDATE SET operation_id = excluded.operation_id
WHERE deletion_attestations.status = 'open';

-- name: AttestationClose :exec
-- Absence is confirmed: the attestation closes now, or, when a deployment of the object is a
-- route the backend's edge may still serve (routed_until, SPEC 8), once that window has passed;
-- the time is persisted here and the attestation reads as open until then (attestation_open).
WITH t AS (
    SELECT (SELECT db_now()) AS now,
           greatest((SELECT db_now()), (SELECT max(d.routed_until) FROM deployments d WHERE d.resource_uid = @uid)) AS closes_at
)
UPDATE deletion_attestations a
SET closes_at = CASE WHEN t.closes_at > t.now THEN t.closes_at END,
    status = (CASE WHEN t.closes_at > t.now THEN 'open' ELSE 'closed' END)::attestation_status,
    closed_at = CASE WHEN t.closes_at > t.now THEN NULL ELSE t.now END
FROM t
WHERE a.uid = @uid AND a.status = 'open' AND a.closes_at IS NULL;

-- name: AttestationSettle :execrows
-- Writes the status of attestations whose propagation window has passed (the janitor's; every
-- reader already takes them as closed).
UPDATE deletion_attestations
SET status = 'closed', closed_at = closes_at
WHERE status = 'open' AND closes_at <= (SELECT db_now());

-- name: AttestationGet :one
-- The attestation as of now: one whose propagation window (closes_at) has passed reads closed.
SELECT uid, resource_kind,
       (CASE WHEN attestation_open(status, closes_at, (SELECT db_now())) THEN 'open' ELSE 'closed' END)::attestation_status AS status,
       operation_id, opened_at, closed_at, closes_at
FROM deletion_attestations
WHERE uid = @uid AND organization_id = @organization_id;

-- name: ResourcesCreatingByOperation :many
-- The workers and endpoints an interrupted operation was creating: a create that never
-- committed never existed, so recovery takes them down.
SELECT 'worker'::resource_kind AS kind, w.uid FROM workers w WHERE w.operation_id = @operation_id::uuid AND w.status = 'creating'
UNION ALL
SELECT 'worker-endpoint'::resource_kind, e.uid FROM worker_endpoints e WHERE e.operation_id = @operation_id::uuid AND e.status = 'creating';

-- name: WorkerScriptNameHeld :one
-- Whether a live script of the installation holds script_name (a chosen label may not take a v1
-- script name a live worker answers at, SPEC 3.3).
SELECT EXISTS (
    SELECT 1 FROM workers
    WHERE installation = @installation AND script_name = @script_name AND status <> 'deleted'
)::boolean AS held;
