-- Where a worker's modules came from: the file path of each module by name, as the provider's
-- module_files gave them (issue 32, SPEC 4: an import into a module_files configuration plans no
-- change). Kept as given and shown on reads; the Host never reads the files. Not part of a
-- generation: a change of paths alone deploys nothing.
ALTER TABLE workers ADD COLUMN module_files jsonb NOT NULL DEFAULT '{}'::jsonb
    CHECK (jsonb_typeof(module_files) = 'object');

-- The view expands w.* when it is created: made again so that it carries the new column.
DROP VIEW worker_states;
CREATE VIEW worker_states AS
SELECT w.*, resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status::text FROM deployments d
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
