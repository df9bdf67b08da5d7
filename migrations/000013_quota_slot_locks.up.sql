-- Quota slots as advisory locks (issue 15). Migration 9's slots were 16 rows per organization and
-- resource, each taken with SELECT ... FOR UPDATE SKIP LOCKED: every create wrote a row lock into
-- the one heap page all 16 share, every create tried the slots from the first, and an
-- organization's first creates made the rows and waited on each other's inserts. A slot is now a
-- transaction-level advisory lock on a key made of the organization, the resource and the slot
-- number: taking it writes nothing, a create tries the slots from a random one onwards, and there
-- is nothing to make first. What a slot means is unchanged: a create holds one until its
-- transaction ends; near the ceiling it gives its slot back and takes all 16 in slot order.

-- The advisory lock key of one slot (a prefix of its own keeps it apart from ownership_lock's keys).
CREATE FUNCTION quota_slot_key(org text, wanted text, slot integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
SELECT hashtextextended('quota-slot/' || org || '/' || wanted || '/' || slot::text, 0)
$$;

CREATE OR REPLACE FUNCTION quota_check(org text, wanted text, at timestamptz, default_ceiling integer)
RETURNS TABLE (overridden boolean, ceiling integer, used bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    c integer;
    effective integer;
    n bigint;
    pick integer;
    got boolean := false;
BEGIN
    SELECT q.ceiling INTO c FROM organization_quotas q WHERE q.organization_id = org AND q.resource = wanted;
    effective := coalesce(c, default_ceiling);
    BEGIN
        -- One free slot, looked for from a random one onwards; with every slot taken, wait for
        -- that one.
        pick := floor(random() * 16)::integer;
        FOR i IN 0..15 LOOP
            IF pg_try_advisory_xact_lock(quota_slot_key(org, wanted, (pick + i) % 16)) THEN
                got := true;
                EXIT;
            END IF;
        END LOOP;
        IF NOT got THEN
            PERFORM pg_advisory_xact_lock(quota_slot_key(org, wanted, pick));
        END IF;
        n := quota_count(org, wanted, at);
        IF n + 32 <= effective THEN
            RETURN QUERY SELECT c IS NOT NULL, effective, n;
            RETURN;
        END IF;
        -- Near the ceiling: undo this block, which releases the slot (a rolled-back
        -- subtransaction releases the advisory locks it took).
        RAISE EXCEPTION USING ERRCODE = 'TQ001';
    EXCEPTION WHEN SQLSTATE 'TQ001' THEN
        NULL;
    END;
    FOR i IN 0..15 LOOP
        PERFORM pg_advisory_xact_lock(quota_slot_key(org, wanted, i));
    END LOOP;
    n := quota_count(org, wanted, at);
    RETURN QUERY SELECT c IS NOT NULL, effective, n;
END
$$;

DROP TABLE organization_quota_slots;
