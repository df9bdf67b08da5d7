DELETE FROM organization_quotas WHERE resource = 'custom_domains';
ALTER TABLE organization_quotas DROP CONSTRAINT organization_quotas_resource_check;
ALTER TABLE organization_quotas ADD CONSTRAINT organization_quotas_resource_check
    CHECK (resource IN ('endpoints', 'reservations', 'runtime_inputs', 'workers'));
