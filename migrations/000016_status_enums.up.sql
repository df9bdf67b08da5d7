-- One name for an endpoint's kind (issue 15): the ledger and the operations say worker-endpoint,
-- and now so do the deployments and the deletion attestations, and the API that answers them.
ALTER TABLE deployments DROP CONSTRAINT deployments_resource_kind_check;
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_resource_kind_check;
UPDATE deployments SET resource_kind = 'worker-endpoint' WHERE resource_kind = 'endpoint';
UPDATE deletion_attestations SET resource_kind = 'worker-endpoint' WHERE resource_kind = 'endpoint';
ALTER TABLE deployments
    ADD CONSTRAINT deployments_resource_kind_check CHECK (resource_kind IN ('worker', 'worker-endpoint'));
ALTER TABLE deletion_attestations
    ADD CONSTRAINT deletion_attestations_resource_kind_check CHECK (resource_kind IN ('worker', 'worker-endpoint'));
