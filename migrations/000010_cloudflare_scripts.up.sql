-- Cloudflare backends, script level (SPEC 8, issue 16).

-- The value-free readback (SPEC 3.5, 8). A backend that never shows a secret's value, nor a keyed
-- digest of one (Cloudflare), settles on what it does show of one script version: the worker UID,
-- the delivery (the preparation id) and the secret names. The dispatch compare-and-swap records
-- SHA-256 of their canonical JSON here, and settle compares the readback with it instead of the
-- keyed material_digest. The pack decides: the column is null for a backend that answers the
-- keyed challenge.
ALTER TABLE runtime_input_preparations
    ADD COLUMN delivery_digest bytea CHECK (delivery_digest IS NULL OR length(delivery_digest) = 32);

-- The per-installation budget of Cloudflare API calls (SPEC 8 "Rate limits"): a token bucket that
-- every Host replica takes from, and the end of the block a 429's Retry-After announced. Nothing
-- here is a secret: the installation's name, a count and two times.
CREATE TABLE cloudflare_rate_budgets (
    installation  text PRIMARY KEY,
    tokens        double precision NOT NULL CHECK (tokens >= 0),
    refilled_at   timestamptz NOT NULL,
    blocked_until timestamptz NOT NULL DEFAULT '-infinity'
);

-- Takes n calls of the installation's budget as of `at`, in one statement under the row's lock:
-- refills by the time passed (at most to capacity), then takes n when the installation is not
-- blocked and the bucket holds n. Answers the seconds to wait, 0 when taken (nothing is taken
-- otherwise).
CREATE FUNCTION rate_budget_take(inst text, n integer, capacity double precision, per_second double precision, at timestamptz)
RETURNS double precision
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    b cloudflare_rate_budgets%ROWTYPE;
    have double precision;
BEGIN
    INSERT INTO cloudflare_rate_budgets (installation, tokens, refilled_at) VALUES (inst, capacity, at)
    ON CONFLICT DO NOTHING;
    SELECT * INTO b FROM cloudflare_rate_budgets WHERE installation = inst FOR UPDATE;
    IF b.blocked_until > at THEN
        RETURN extract(epoch FROM b.blocked_until - at);
    END IF;
    have := least(capacity, b.tokens + greatest(0, extract(epoch FROM at - b.refilled_at)) * per_second);
    IF have < n THEN
        UPDATE cloudflare_rate_budgets SET tokens = have, refilled_at = greatest(at, b.refilled_at) WHERE installation = inst;
        RETURN (n - have) / per_second;
    END IF;
    UPDATE cloudflare_rate_budgets SET tokens = have - n, refilled_at = greatest(at, b.refilled_at) WHERE installation = inst;
    RETURN 0;
END
$$;

-- Records a 429: the installation is blocked until at + retry (never shortened) and its bucket
-- emptied, so that no replica calls before Cloudflare lets it.
CREATE FUNCTION rate_budget_block(inst text, retry interval, at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    until timestamptz;
BEGIN
    INSERT INTO cloudflare_rate_budgets AS b (installation, tokens, refilled_at, blocked_until)
    VALUES (inst, 0, at, at + retry)
    ON CONFLICT (installation) DO UPDATE
    SET tokens = 0, refilled_at = greatest(b.refilled_at, at + retry),
        blocked_until = greatest(b.blocked_until, at + retry)
    RETURNING b.blocked_until INTO until;
    RETURN until;
END
$$;

-- The script ceiling (SPEC 8): a Cloudflare account (or dispatch namespace) holds a limited number
-- of scripts across every organization an installation is sold to. A worker create takes one of
-- 16 slot rows of its installation, as organization quotas do (migration 9): far from the ceiling
-- creates pass side by side; near it one takes all 16, in slot order, and counts exactly.
CREATE TABLE installation_script_slots (
    installation text NOT NULL,
    slot         smallint NOT NULL CHECK (slot >= 0 AND slot < 16),
    PRIMARY KEY (installation, slot)
);

-- What counts: every worker of the installation that may hold a script (its delete not confirmed),
-- through its own partial index; the plan is made once for every installation, so sequential
-- scans are off inside (as quota_count does).
CREATE INDEX workers_installation_live_idx ON workers (installation) WHERE status <> 'deleted';

CREATE FUNCTION installation_script_count(inst text) RETURNS bigint
LANGUAGE sql STABLE SET enable_seqscan = off AS $$
    SELECT count(*) FROM workers w WHERE w.installation = inst AND w.status <> 'deleted';
$$;

-- The script-ceiling step of a worker create, in one round trip: one slot taken for the rest of
-- the transaction (all 16 near the ceiling), then the installation's scripts counted.
CREATE FUNCTION installation_script_check(inst text, ceiling integer)
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
