-- Per-organization ceilings (SPEC 5.1). One row per (organization, resource) that a create locks
-- before it counts what the organization holds: two creates at the ceiling, on any Host replicas,
-- serialize on this row, and the second counts after the first committed, so exactly the ceiling
-- passes. ceiling NULL means the catalog's default (the catalog lives in each Host's config file,
-- not here); a number is an operator's override (takoserver orgs quota).
CREATE TABLE organization_quotas (
    organization_id text NOT NULL REFERENCES organizations (id),
    resource        text NOT NULL CHECK (resource IN ('endpoints', 'reservations', 'runtime_inputs', 'workers')),
    ceiling         integer CHECK (ceiling BETWEEN 0 AND 1000000),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, resource)
);

-- The lock step of a create that a ceiling bounds: make the rows of the wanted resources exist,
-- then lock them, in resource order (so two creates that take several never deadlock), and
-- return their overrides. Callers count what the organization holds in a later statement, which
-- reads a snapshot taken after the lock was granted (READ COMMITTED): a count in the same
-- statement would read the snapshot taken before it waited.
CREATE FUNCTION quota_lock(org text, wanted text[])
RETURNS TABLE (resource text, ceiling integer)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
BEGIN
    INSERT INTO organization_quotas (organization_id, resource)
    SELECT org, w FROM unnest(wanted) AS w ORDER BY w
    ON CONFLICT DO NOTHING;
    RETURN QUERY
    SELECT q.resource, q.ceiling FROM organization_quotas q
    WHERE q.organization_id = org AND q.resource = ANY (wanted)
    ORDER BY q.resource
    FOR UPDATE;
END
$$;

-- What the counts read: the live reservations and the pending runtime inputs of one
-- organization (workers and endpoints are counted through their live-key indexes), so a count
-- never walks an organization's released or settled history.
CREATE INDEX worker_endpoint_origin_reservations_live_idx ON worker_endpoint_origin_reservations (organization_id)
    WHERE status IN ('prepared', 'bound', 'activated');
CREATE INDEX runtime_input_preparations_pending_idx ON runtime_input_preparations (organization_id)
    WHERE status IN ('prepared', 'claimed');
