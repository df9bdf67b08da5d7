-- Migration 10's slot rows and installation_script_check, as they were.
CREATE TABLE installation_script_slots (
    installation text NOT NULL,
    slot         smallint NOT NULL CHECK (slot >= 0 AND slot < 16),
    PRIMARY KEY (installation, slot)
);

CREATE OR REPLACE FUNCTION installation_script_check(inst text, ceiling integer)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
    s smallint;
    pick smallint;
BEGIN
    BEGIN
        SELECT q.slot INTO s FROM installation_script_slots q
        WHERE q.installation = inst LIMIT 1 FOR UPDATE SKIP LOCKED;
        IF s IS NULL THEN
            INSERT INTO installation_script_slots (installation, slot)
            SELECT inst, g FROM generate_series(0, 15) AS g ON CONFLICT DO NOTHING;
            pick := floor(random() * 16)::smallint;
            SELECT q.slot INTO s FROM installation_script_slots q
            WHERE q.installation = inst AND q.slot = pick FOR UPDATE;
            IF s IS NULL THEN
                RAISE EXCEPTION 'script slot % of %s is missing', pick, inst;
            END IF;
        END IF;
        n := installation_script_count(inst);
        -- At most 16 creates in flight, each one worker row not committed yet.
        IF n + 16 < ceiling THEN
            RETURN n;
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'TQ002';
    EXCEPTION WHEN SQLSTATE 'TQ002' THEN
        NULL;
    END;
    INSERT INTO installation_script_slots (installation, slot)
    SELECT inst, g FROM generate_series(0, 15) AS g ON CONFLICT DO NOTHING;
    PERFORM 1 FROM installation_script_slots q WHERE q.installation = inst ORDER BY q.slot FOR UPDATE;
    RETURN installation_script_count(inst);
END
$$;

DROP FUNCTION script_slot_key(text, integer);
