-- name: WorkersLockForBinding :exec
-- The workers a caller's put binds to (and the caller itself, on an update), locked in UID order:
-- every put takes its locks in the same order, so two callers binding to each other never
-- deadlock, and a delete of a callee (which locks that one row) waits for the put or the put for
-- it (SPEC 3.6: a worker that a live worker binds to refuses deletion). The rows alone: a join
-- here would be re-checked against the old operation row when a concurrent put had moved the
-- worker to a new one, and the worker would vanish from the answer; WorkersForBinding reads them
-- next, under the locks, with a snapshot taken after them.
SELECT 1 FROM (
    SELECT w.uid FROM workers w
    WHERE w.organization_id = @organization_id AND w.uid = ANY(@uids::uuid[])
    ORDER BY w.uid
    FOR UPDATE OF w
) locked;

-- name: WorkersForBinding :many
-- The locked workers, as they stand. Only the organization's: another organization's UID is not
-- found.
SELECT w.uid, w.installation, w.script_name, w.status, w.script_collision, resource_present(w.status, o.status)::boolean AS present
FROM workers w
JOIN operations o ON o.id = w.operation_id
WHERE w.organization_id = @organization_id AND w.uid = ANY(@uids::uuid[]);

-- name: ServiceBindingsAdd :exec
-- A generation's bindings join the caller's index beside those already there (migration 15).
INSERT INTO worker_service_bindings (caller_uid, binding, callee_uid)
SELECT @caller_uid::uuid, unnest(@bindings::text[]), unnest(@callees::uuid[])
ON CONFLICT DO NOTHING;

-- name: ServiceBindingsKeepOnly :exec
-- Once a generation is deployed, the caller's index holds its bindings alone.
DELETE FROM worker_service_bindings b
WHERE b.caller_uid = @caller_uid
  AND (b.binding, b.callee_uid) NOT IN (SELECT unnest(@bindings::text[]), unnest(@callees::uuid[]));

-- name: WorkerCallers :many
-- The workers that bind to a worker (itself aside), as space/name: its delete waits for them.
-- Every caller that stands counts (resource_present, as for endpoints): one still being created
-- (its create may yet commit), and one being deleted (its script may still run and call).
SELECT DISTINCT (w.space || '/' || w.name)::text AS caller
FROM worker_service_bindings b
JOIN workers w ON w.uid = b.caller_uid
JOIN operations o ON o.id = w.operation_id
WHERE b.callee_uid = @callee_uid AND b.caller_uid <> @callee_uid AND resource_present(w.status, o.status)
ORDER BY 1;
