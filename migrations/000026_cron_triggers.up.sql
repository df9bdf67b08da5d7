-- Cron triggers on selfhost (SPEC 3.6). A worker's crons live in its settings; each (worker, cron)
-- of a live selfhost worker has a row here holding its next tick, kept in step with the worker's
-- row by a trigger in the same transaction as every write of it (create, update, recovery,
-- delete). The Host replica that moves next_tick forward by a compare-and-swap on database time
-- claims that tick; no other can, so a tick runs at most once.
CREATE TABLE worker_crons (
    worker_uid uuid NOT NULL REFERENCES workers (uid),
    cron       text NOT NULL,
    -- NULL until a Host computes the first tick after the row appeared, by database time.
    next_tick  timestamptz,
    PRIMARY KEY (worker_uid, cron)
);

CREATE INDEX worker_crons_due_idx ON worker_crons (next_tick);
CREATE INDEX worker_crons_unscheduled_idx ON worker_crons (worker_uid) WHERE next_tick IS NULL;

CREATE FUNCTION sync_worker_crons() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    wanted jsonb := CASE WHEN NEW.status <> 'deleted' AND NEW.pack = 'selfhost'
                         THEN COALESCE(NEW.settings -> 'crons', '[]'::jsonb) ELSE '[]'::jsonb END;
BEGIN
    DELETE FROM worker_crons c WHERE c.worker_uid = NEW.uid AND NOT (wanted ? c.cron);
    INSERT INTO worker_crons (worker_uid, cron)
    SELECT NEW.uid, x FROM jsonb_array_elements_text(wanted) AS x
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;

CREATE TRIGGER workers_sync_crons AFTER INSERT OR UPDATE OF settings, status, pack ON workers
FOR EACH ROW EXECUTE FUNCTION sync_worker_crons();

-- What became of each tick a Host claimed: claimed (asked of a node, no answer recorded yet), ok or
-- exception (the handler's outcome), failed (no node ran it: the detail says why), missed (more
-- than 60 s late, never run; missed counts the ticks it stands for), braked (a deployment brake
-- covered the worker). The last 100 of each worker are kept. One row per scheduled tick: a second
-- claim of the same tick cannot insert.
CREATE TYPE cron_tick_outcome AS ENUM ('claimed', 'ok', 'exception', 'failed', 'missed', 'braked');

CREATE TABLE cron_ticks (
    id            uuid PRIMARY KEY,
    worker_uid    uuid NOT NULL REFERENCES workers (uid),
    cron          text NOT NULL,
    scheduled_for timestamptz NOT NULL,
    outcome       cron_tick_outcome NOT NULL,
    missed        integer NOT NULL DEFAULT 0,
    detail        text NOT NULL DEFAULT '',
    claimed_at    timestamptz NOT NULL DEFAULT db_now(),
    finished_at   timestamptz,
    UNIQUE (worker_uid, cron, scheduled_for)
);

CREATE INDEX cron_ticks_recent_idx ON cron_ticks (worker_uid, scheduled_for DESC);
-- The ticks whose outcome nobody recorded yet (the janitor's abandoned-ticks step).
CREATE INDEX cron_ticks_claimed_idx ON cron_ticks (scheduled_for) WHERE outcome = 'claimed';

-- Workers that were already live get their rows now.
UPDATE workers SET settings = settings WHERE status <> 'deleted' AND pack = 'selfhost' AND settings ? 'crons';

-- The cron ceiling of a Cloudflare installation (SPEC 3.6: Cloudflare caps cron triggers per
-- account): the crons of every worker of the installation that may hold a script, but the one
-- being written, counted under one transaction-level advisory lock of the installation (a key of
-- its own, beside migration 14's script slots), so that two writes of crons at once count one
-- after the other. Only a write that has crons asks.
CREATE FUNCTION installation_cron_count(inst text, writing uuid) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
DECLARE
    n bigint;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended('cron-ceiling/' || inst, 0));
    SELECT COALESCE(sum(jsonb_array_length(COALESCE(w.settings -> 'crons', '[]'::jsonb))), 0) INTO n
    FROM workers w WHERE w.installation = inst AND w.status <> 'deleted' AND w.uid <> writing;
    RETURN n;
END
$$;
