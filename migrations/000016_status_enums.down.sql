ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_resource_kind_check;
ALTER TABLE deployments DROP CONSTRAINT deployments_resource_kind_check;
UPDATE deletion_attestations SET resource_kind = 'endpoint' WHERE resource_kind = 'worker-endpoint';
UPDATE deployments SET resource_kind = 'endpoint' WHERE resource_kind = 'worker-endpoint';
ALTER TABLE deletion_attestations
    ADD CONSTRAINT deletion_attestations_resource_kind_check CHECK (resource_kind IN ('worker', 'endpoint'));
ALTER TABLE deployments
    ADD CONSTRAINT deployments_resource_kind_check CHECK (resource_kind IN ('worker', 'endpoint'));
