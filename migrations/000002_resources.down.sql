DROP TABLE brakes;
DROP TABLE deletion_attestations;
DROP TABLE backend_effects;
DROP TABLE deployments;
DROP TABLE worker_endpoints;
DROP TABLE workers;
DROP FUNCTION resource_present;
DELETE FROM ownership_bindings WHERE state = 'pending';
ALTER TABLE ownership_bindings
    DROP CONSTRAINT ownership_bindings_response_check,
    ALTER COLUMN response_status SET NOT NULL,
    ALTER COLUMN response_body SET NOT NULL,
    DROP COLUMN state,
    ADD CONSTRAINT ownership_bindings_response_status_check CHECK (response_status BETWEEN 200 AND 299);
DROP TABLE operations;
