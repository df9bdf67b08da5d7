-- Script-ceiling slots as advisory locks (issue 16, the design migration 13 gave organization
-- quotas). Migration 10's installation_script_check took one of 16 slot rows per installation,
-- each with SELECT ... FOR UPDATE SKIP LOCKED from the first row, and made the rows with INSERT
-- ... ON CONFLICT: every worker create of every organization sold the installation wrote a row
-- lock into the one heap page the 16 rows share and tried them in the same order, so one
-- tenant's burst of creates slowed every other tenant's. A slot is now a transaction-level
-- advisory lock on a key of the installation and the slot number: taking it writes nothing, a
-- create tries the slots from a random one onwards, and there is nothing to make first.
--
-- The margin: a create holds its slot until its transaction ends and inserts one worker row after
-- the check, so at most 16 creates are in flight (this one included) with at most 16 rows the
-- count cannot see yet. A count that leaves room for 16 more cannot pass the ceiling whatever
-- they commit (quota_check's 32 is the same rule: 16 slots, at most two rows each). Nearer the
-- ceiling the create gives its slot back and takes all 16 in slot order: every create in flight
-- has finished by then, and the count is exact.

-- The advisory lock key of one script slot (a prefix of its own keeps it apart from
-- quota_slot_key's and ownership_lock's keys).
CREATE FUNCTION script_slot_key(inst text, slot integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
SELECT hashtextextended('script-slot/' || inst || '/' || slot::text, 0)
$$;

CREATE OR REPLACE FUNCTION installation_script_check(inst text, ceiling integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
    pick integer;
    got boolean := false;
BEGIN
    BEGIN
        -- One free slot, looked for from a random one onwards; with every slot taken, wait for
        -- that one.
        pick := floor(random() * 16)::integer;
        FOR i IN 0..15 LOOP
            IF pg_try_advisory_xact_lock(script_slot_key(inst, (pick + i) % 16)) THEN
                got := true;
                EXIT;
            END IF;
        END LOOP;
        IF NOT got THEN
            PERFORM pg_advisory_xact_lock(script_slot_key(inst, pick));
        END IF;
        n := installation_script_count(inst);
        IF n + 16 <= ceiling THEN
            RETURN n;
        END IF;
        -- Near the ceiling: undo this block, which releases the slot (a rolled-back
        -- subtransaction releases the advisory locks it took).
        RAISE EXCEPTION USING ERRCODE = 'TQ002';
    EXCEPTION WHEN SQLSTATE 'TQ002' THEN
        NULL;
    END;
    FOR i IN 0..15 LOOP
        PERFORM pg_advisory_xact_lock(script_slot_key(inst, i));
    END LOOP;
    RETURN installation_script_count(inst);
END
$$;

DROP TABLE installation_script_slots;
