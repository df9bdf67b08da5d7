-- The quota step without one queue per organization (issue 15). quota_check used to lock the
-- organization's one row of a resource until its transaction ended, so every create of an
-- organization waited for the one before it to commit. Now a create takes one of 16 slot rows of
-- the organization and resource. With at most 16 creates in flight, each with at most two rows of
-- the resource not committed yet, a count that leaves room for 32 more cannot pass the ceiling
-- whatever the others commit: those creates pass at once, side by side. Nearer the ceiling the
-- create gives its slot back and takes all 16 in slot order: every create in flight has finished
-- by then, and the count is exact, as before.
CREATE TABLE organization_quota_slots (
    organization_id text NOT NULL,
    resource        text NOT NULL,
    slot            smallint NOT NULL CHECK (slot >= 0 AND slot < 16),
    PRIMARY KEY (organization_id, resource, slot)
);

-- What the organization holds of one resource as of `at`, through its own partial indexes; the
-- plan is made once for every organization of the Host, so sequential scans are off inside.
CREATE FUNCTION quota_count(org text, wanted text, at timestamptz) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    n bigint;
BEGIN
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
    RETURN n;
END
$$;

DROP FUNCTION quota_check(text, text, timestamptz);

-- The quota step of a create in one round trip: the organization's override of the resource (the
-- catalog's default_ceiling without one), and what it holds, counted (each count a statement of its
-- own, so a fresh snapshot) once this create's slot or slots are granted. The caller refuses when
-- used reaches the ceiling; used is exact whenever it is near it.
CREATE FUNCTION quota_check(org text, wanted text, at timestamptz, default_ceiling integer)
RETURNS TABLE (overridden boolean, ceiling integer, used bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    c integer;
    effective integer;
    n bigint;
    s smallint;
    pick smallint;
BEGIN
    SELECT q.ceiling INTO c FROM organization_quotas q WHERE q.organization_id = org AND q.resource = wanted;
    effective := coalesce(c, default_ceiling);
    BEGIN
        SELECT q.slot INTO s FROM organization_quota_slots q
        WHERE q.organization_id = org AND q.resource = wanted
        LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF s IS NULL THEN
            -- First use, or every slot taken: make the slots, then wait for one.
            INSERT INTO organization_quota_slots (organization_id, resource, slot)
            SELECT org, wanted, g FROM generate_series(0, 15) AS g
            ON CONFLICT DO NOTHING;
            -- One slot drawn once (random() in the WHERE clause would be drawn again per row,
            -- and often match none, leaving this create holding no slot).
            pick := floor(random() * 16)::smallint;
            SELECT q.slot INTO s FROM organization_quota_slots q
            WHERE q.organization_id = org AND q.resource = wanted AND q.slot = pick
            FOR UPDATE;
            IF s IS NULL THEN
                RAISE EXCEPTION 'quota slot % of %/% is missing', pick, org, wanted;
            END IF;
        END IF;
        n := quota_count(org, wanted, at);
        IF n + 32 <= effective THEN
            RETURN QUERY SELECT c IS NOT NULL, effective, n;
            RETURN;
        END IF;
        -- Near the ceiling: undo this block, which gives the slot back.
        RAISE EXCEPTION USING ERRCODE = 'TQ001';
    EXCEPTION WHEN SQLSTATE 'TQ001' THEN
        NULL;
    END;
    INSERT INTO organization_quota_slots (organization_id, resource, slot)
    SELECT org, wanted, g FROM generate_series(0, 15) AS g
    ON CONFLICT DO NOTHING;
    PERFORM 1 FROM organization_quota_slots q
    WHERE q.organization_id = org AND q.resource = wanted
    ORDER BY q.slot FOR UPDATE;
    n := quota_count(org, wanted, at);
    RETURN QUERY SELECT c IS NOT NULL, effective, n;
END
$$;
