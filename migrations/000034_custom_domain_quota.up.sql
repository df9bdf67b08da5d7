-- An organization's ceiling of custom domains may be overridden (takoserver orgs quota
-- --custom-domains) like its other ceilings. Custom domains have no counter shards: a claim's
-- create counts them under a lock of the organization's own.
ALTER TABLE organization_quotas DROP CONSTRAINT organization_quotas_resource_check;
ALTER TABLE organization_quotas ADD CONSTRAINT organization_quotas_resource_check
    CHECK (resource IN ('endpoints', 'reservations', 'runtime_inputs', 'workers', 'custom_domains'));
