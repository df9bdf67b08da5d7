-- A worker's plain configuration beside its code (issue 17): plain-text and JSON variables and
-- compatibility flags, one JSON document ({"vars": {...}, "jsonVars": {...}, "compatibilityFlags":
-- [...]}) that changes with the worker's generation. Nothing in it is secret: secrets stay sealed in
-- runtime inputs.
ALTER TABLE workers ADD COLUMN settings jsonb NOT NULL DEFAULT '{}';

-- The view's w.* was fixed when it was made: make it again to carry the new column.
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
