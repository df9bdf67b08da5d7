DROP FUNCTION quota_check(text, text, timestamptz, integer);
DROP FUNCTION quota_count(text, text, timestamptz);
DROP TABLE organization_quota_slots;

-- Migration 7's quota_check, as it was.
CREATE FUNCTION quota_check(org text, wanted text, at timestamptz)
RETURNS TABLE (overridden boolean, ceiling integer, used bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    c integer;
    n bigint;
BEGIN
    INSERT INTO organization_quotas (organization_id, resource) VALUES (org, wanted) ON CONFLICT DO NOTHING;
    SELECT q.ceiling INTO c FROM organization_quotas q WHERE q.organization_id = org AND q.resource = wanted FOR UPDATE;
    CASE wanted
    WHEN 'workers' THEN
        SELECT count(*) INTO n FROM workers w WHERE w.organization_id = org AND w.status <> 'deleted';
    WHEN 'endpoints' THEN
        SELECT count(*) INTO n FROM worker_endpoints e WHERE e.organization_id = org AND e.status <> 'deleted';
    WHEN 'reservations' THEN
        SELECT count(*) INTO n FROM worker_endpoint_origin_reservations r
        WHERE r.organization_id = org AND r.status IN ('prepared', 'bound', 'activated')
          AND (r.status = 'activated' OR r.expires_at > at OR reservation_published(r.status, r.endpoint_uid));
    WHEN 'runtime_inputs' THEN
        SELECT count(*) INTO n FROM runtime_input_preparations p
        WHERE p.organization_id = org AND p.status IN ('prepared', 'claimed')
          AND ((p.status = 'prepared' AND p.expires_at > at) OR (p.status = 'claimed' AND p.claim_expires_at > at));
    END CASE;
    RETURN QUERY SELECT c IS NOT NULL, coalesce(c, 0), n;
END
$$;
