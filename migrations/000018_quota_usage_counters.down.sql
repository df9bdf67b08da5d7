-- Migration 13's quota step, counting every time, and no counters.
DROP TRIGGER workers_usage ON workers;
DROP TRIGGER worker_endpoints_usage ON worker_endpoints;
DROP TRIGGER worker_endpoint_origin_reservations_usage ON worker_endpoint_origin_reservations;
DROP TRIGGER runtime_input_preparations_usage ON runtime_input_preparations;
DROP FUNCTION quota_usage_recount();
DROP FUNCTION usage_track();
DROP FUNCTION usage_shard(text, text);
DROP FUNCTION usage_shard_note(text, text, integer);
DROP FUNCTION usage_shard_key(text, text, integer);
DROP FUNCTION usage_counted(text, text);
DROP TABLE organization_usage;
DROP INDEX worker_endpoint_origin_reservations_lapse_idx;

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
