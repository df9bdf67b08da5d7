-- Migration 9's slot rows and quota_check, as they were.
CREATE TABLE organization_quota_slots (
    organization_id text NOT NULL,
    resource        text NOT NULL,
    slot            smallint NOT NULL CHECK (slot >= 0 AND slot < 16),
    PRIMARY KEY (organization_id, resource, slot)
);

CREATE OR REPLACE FUNCTION quota_check(org text, wanted text, at timestamptz, default_ceiling integer)
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

DROP FUNCTION quota_slot_key(text, text, integer);
