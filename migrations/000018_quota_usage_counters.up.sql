-- What an organization holds, counted as it changes (issue 15). Until now a create's quota step
-- counted the organization's live rows of the resource every time, so its cost grew with what the
-- organization held: an operator who lifted a ceiling to thousands made every create count
-- thousands of rows. Each row write that makes a row count or stop counting now adds +1 or -1 to
-- one of the organization's counter shards, and the quota step reads the shards' sum: an upper
-- bound of what the exact count finds (a reservation or runtime input whose window passed still
-- counts here until a write stores its expiry). Far below the ceiling the bound decides alone;
-- near it, the quota step counts exactly as before (all slots taken, lazy expiry computed).
--
-- Writers never wait on a counter row: a shard is written only by the transaction holding its
-- advisory lock. Shards 0-15 are the quota slots (migration 13): a create writes the shard of the
-- slot it holds. Shards 16-31 are taken by a transaction that changes a count without holding a
-- slot (a release, a delete, an expiry), each with a lock of its own family, tried from a random
-- one onwards like a slot; the quota step never waits for them. The shard a transaction writes is
-- remembered in a transaction-local setting, so one transaction writes one shard per organization
-- and resource (the newest noted).

-- The four tables the triggers go on, locked at once and first (a Host still writing two of them
-- in the other order would otherwise deadlock with this migration's CREATE TRIGGERs).
LOCK TABLE workers, worker_endpoints, worker_endpoint_origin_reservations, runtime_input_preparations IN SHARE ROW EXCLUSIVE MODE;

CREATE TABLE organization_usage (
    organization_id text NOT NULL,
    resource        text NOT NULL CHECK (resource IN ('endpoints', 'reservations', 'runtime_inputs', 'workers')),
    shard           smallint NOT NULL CHECK (shard >= 0 AND shard < 32),
    held            bigint NOT NULL,
    PRIMARY KEY (organization_id, resource, shard)
) WITH (fillfactor = 50); -- room on each page for the updates to stay heap-only

-- The janitor's lazy expiry of the reservations nothing touches again (ReservationsExpireLapsed):
-- without it a lapsed reservation would keep counting in the counters until a write swept it.
CREATE INDEX worker_endpoint_origin_reservations_lapse_idx ON worker_endpoint_origin_reservations (expires_at)
    WHERE status IN ('prepared', 'bound');

-- Whether a row in this status counts toward its organization's ceiling of the resource: the
-- statuses of the exact counts (quota_count), without their expiry.
CREATE FUNCTION usage_counted(wanted text, status text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
SELECT CASE wanted
    WHEN 'workers' THEN status <> 'deleted'
    WHEN 'endpoints' THEN status <> 'deleted'
    WHEN 'reservations' THEN status IN ('prepared', 'bound', 'activated')
    WHEN 'runtime_inputs' THEN status IN ('prepared', 'claimed')
END
$$;

-- The advisory lock key of one of shards 16-31 (a prefix of its own keeps it apart from the quota
-- slots' and ownership_lock's keys).
CREATE FUNCTION usage_shard_key(org text, wanted text, n integer) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
SELECT hashtextextended('usage-shard/' || org || '/' || wanted || '/' || n::text, 0)
$$;

-- Notes that this transaction writes shard for the organization's resource (the newest note is
-- the one read) and returns it.
-- (plpgsql, not sql: a sql function of two statements is planned again on every call.)
CREATE FUNCTION usage_shard_note(org text, wanted text, shard integer) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('takoform.usage_shards',
        ';' || org || '/' || wanted || '=' || shard::text || ';' || coalesce(current_setting('takoform.usage_shards', true), ''), true);
    RETURN shard;
END
$$;

-- The shard this transaction writes for the organization's resource: the one it noted, else one
-- of shards 16-31 whose lock it takes now (the first free one from a random one onwards; with all
-- taken, it waits for that one).
CREATE FUNCTION usage_shard(org text, wanted text) RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    noted text := coalesce(current_setting('takoform.usage_shards', true), '');
    key text := ';' || org || '/' || wanted || '=';
    i integer := strpos(noted, key);
    pick integer;
BEGIN
    IF i > 0 THEN
        RETURN split_part(substr(noted, i + length(key)), ';', 1)::integer;
    END IF;
    pick := floor(random() * 16)::integer;
    FOR k IN 0..15 LOOP
        IF pg_try_advisory_xact_lock(usage_shard_key(org, wanted, (pick + k) % 16)) THEN
            RETURN usage_shard_note(org, wanted, 16 + (pick + k) % 16);
        END IF;
    END LOOP;
    PERFORM pg_advisory_xact_lock(usage_shard_key(org, wanted, pick));
    RETURN usage_shard_note(org, wanted, 16 + pick);
END
$$;

-- The row trigger of the four tables a ceiling bounds (TG_ARGV[0]: the resource): a write that
-- makes a row count or stop counting adds its +1 or -1 to this transaction's shard.
CREATE FUNCTION usage_track() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    wanted text := TG_ARGV[0];
    delta integer := 0;
    org text;
    n integer;
BEGIN
    IF TG_OP = 'INSERT' OR TG_OP = 'UPDATE' THEN
        delta := delta + usage_counted(wanted, NEW.status::text)::integer;
    END IF;
    IF TG_OP = 'UPDATE' OR TG_OP = 'DELETE' THEN
        delta := delta - usage_counted(wanted, OLD.status::text)::integer;
    END IF;
    IF delta = 0 THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'DELETE' THEN
        org := OLD.organization_id;
    ELSE
        org := NEW.organization_id;
    END IF;
    n := usage_shard(org, wanted);
    -- An update of the shard's row, which its lock's holder alone writes; the row is made on the
    -- shard's first use.
    UPDATE organization_usage u SET held = u.held + delta
    WHERE u.organization_id = org AND u.resource = wanted AND u.shard = n;
    IF NOT FOUND THEN
        INSERT INTO organization_usage AS u (organization_id, resource, shard, held) VALUES (org, wanted, n, delta)
        ON CONFLICT (organization_id, resource, shard) DO UPDATE SET held = u.held + excluded.held;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER workers_usage AFTER INSERT OR DELETE OR UPDATE OF status ON workers
    FOR EACH ROW EXECUTE FUNCTION usage_track('workers');
CREATE TRIGGER worker_endpoints_usage AFTER INSERT OR DELETE OR UPDATE OF status ON worker_endpoints
    FOR EACH ROW EXECUTE FUNCTION usage_track('endpoints');
CREATE TRIGGER worker_endpoint_origin_reservations_usage AFTER INSERT OR DELETE OR UPDATE OF status ON worker_endpoint_origin_reservations
    FOR EACH ROW EXECUTE FUNCTION usage_track('reservations');
CREATE TRIGGER runtime_input_preparations_usage AFTER INSERT OR DELETE OR UPDATE OF status ON runtime_input_preparations
    FOR EACH ROW EXECUTE FUNCTION usage_track('runtime_inputs');

-- An operator's repair (takoserver orgs counters --recount), should the counters ever drift from
-- the rows (a write that got past the triggers: a restore without them, a trigger disabled): the
-- four tables locked against writers while every organization's counters are made again from its
-- rows, into shard 0. Returns how many counter rows it wrote.
CREATE FUNCTION quota_usage_recount() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    n bigint;
BEGIN
    LOCK TABLE workers, worker_endpoints, worker_endpoint_origin_reservations, runtime_input_preparations IN SHARE MODE;
    DELETE FROM organization_usage;
    INSERT INTO organization_usage (organization_id, resource, shard, held)
    SELECT organization_id, 'workers', 0, count(*) FROM workers WHERE usage_counted('workers', status::text) GROUP BY organization_id
    UNION ALL
    SELECT organization_id, 'endpoints', 0, count(*) FROM worker_endpoints WHERE usage_counted('endpoints', status::text) GROUP BY organization_id
    UNION ALL
    SELECT organization_id, 'reservations', 0, count(*) FROM worker_endpoint_origin_reservations WHERE usage_counted('reservations', status::text) GROUP BY organization_id
    UNION ALL
    SELECT organization_id, 'runtime_inputs', 0, count(*) FROM runtime_input_preparations WHERE usage_counted('runtime_inputs', status::text) GROUP BY organization_id;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END
$$;

-- What the organizations hold now, into shard 0. The triggers above were created first, in this
-- same transaction, with the four tables locked against writers: nothing is counted twice or
-- missed.
SELECT quota_usage_recount();

-- Migration 13's quota step, deciding on the counters far below the ceiling: one slot taken (and
-- noted as this transaction's shard), the shards' sum read; with 32 to spare it answers with that
-- bound. Otherwise the exact count decides, with the slot alone when it leaves 32 to spare, and
-- with every slot taken near the ceiling, as before.
CREATE OR REPLACE FUNCTION quota_check(org text, wanted text, at timestamptz, default_ceiling integer)
RETURNS TABLE (overridden boolean, ceiling integer, used bigint)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    c integer;
    effective integer;
    n bigint;
    pick integer;
    got integer;
BEGIN
    SELECT q.ceiling INTO c FROM organization_quotas q WHERE q.organization_id = org AND q.resource = wanted;
    effective := coalesce(c, default_ceiling);
    BEGIN
        -- One free slot, looked for from a random one onwards; with every slot taken, wait for
        -- that one.
        pick := floor(random() * 16)::integer;
        FOR i IN 0..15 LOOP
            IF pg_try_advisory_xact_lock(quota_slot_key(org, wanted, (pick + i) % 16)) THEN
                got := (pick + i) % 16;
                EXIT;
            END IF;
        END LOOP;
        IF got IS NULL THEN
            PERFORM pg_advisory_xact_lock(quota_slot_key(org, wanted, pick));
            got := pick;
        END IF;
        PERFORM usage_shard_note(org, wanted, got);
        SELECT coalesce(sum(u.held), 0) INTO n FROM organization_usage u WHERE u.organization_id = org AND u.resource = wanted;
        IF n + 32 <= effective THEN
            RETURN QUERY SELECT c IS NOT NULL, effective, n;
            RETURN;
        END IF;
        n := quota_count(org, wanted, at);
        IF n + 32 <= effective THEN
            RETURN QUERY SELECT c IS NOT NULL, effective, n;
            RETURN;
        END IF;
        -- Near the ceiling: undo this block, which releases the slot and its note (a rolled-back
        -- subtransaction releases the advisory locks it took and the settings it made).
        RAISE EXCEPTION USING ERRCODE = 'TQ001';
    EXCEPTION WHEN SQLSTATE 'TQ001' THEN
        NULL;
    END;
    FOR i IN 0..15 LOOP
        PERFORM pg_advisory_xact_lock(quota_slot_key(org, wanted, i));
    END LOOP;
    PERFORM usage_shard_note(org, wanted, 0);
    n := quota_count(org, wanted, at);
    RETURN QUERY SELECT c IS NOT NULL, effective, n;
END
$$;
