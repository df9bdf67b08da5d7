-- A script name is one worker's (SPEC 3.4). Script names are unique per script namespace among
-- workers that stand (a delete's attestation closes in the transaction that marks the worker
-- deleted), across every organization: a unique index, not a probability. An installation is one
-- script namespace (the catalog refuses two installations that share a runtime node, account or
-- dispatch namespace), so the index is over (installation, script_name).
--
-- v1 names kept 32 bits of hash, and two organizations' live workers can share one (the attack
-- pair of the vectors). The earliest holder keeps the name; the others are marked colliding, stay
-- out of the index, and read ready:false (ScriptNameCollision) until they are replaced.
ALTER TABLE workers ADD COLUMN script_collision boolean NOT NULL DEFAULT false;

UPDATE workers w SET script_collision = true
WHERE w.status <> 'deleted'
  AND EXISTS (SELECT 1 FROM workers h
              WHERE h.installation = w.installation AND h.script_name = w.script_name
                AND h.status <> 'deleted' AND h.uid <> w.uid
                AND (h.created_at, h.uid) < (w.created_at, w.uid));

CREATE UNIQUE INDEX workers_script_key ON workers (installation, script_name)
WHERE status <> 'deleted' AND NOT script_collision;

-- The view's w.* is fixed when it is made: it is made again to carry the new column.
DROP VIEW worker_states;
CREATE VIEW worker_states AS
SELECT w.*, resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = w.uid AND d.generation = w.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = w.uid AND d.generation = w.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id,
       p.status AS runtime_input_status,
       p.worker_uid AS runtime_input_worker_uid
FROM workers w
JOIN operations o ON o.id = w.operation_id
LEFT JOIN runtime_input_preparations p ON p.organization_id = w.organization_id AND p.reference = w.runtime_input_reference;
