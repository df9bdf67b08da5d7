DROP VIEW worker_states;
ALTER TABLE workers DROP COLUMN module_files;
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
