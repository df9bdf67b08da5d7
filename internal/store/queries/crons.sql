-- name: CronsUnscheduled :many
-- Rows whose first tick no Host has computed yet (a cron just added), with database time.
SELECT c.worker_uid, c.cron, db_now()::timestamptz AS now
FROM worker_crons c
WHERE c.next_tick IS NULL
LIMIT 500;

-- name: CronSchedule :execrows
-- The first tick of a row, set once: a replica that computed it too changes nothing.
UPDATE worker_crons SET next_tick = @next_tick::timestamptz
WHERE worker_uid = @worker_uid AND cron = @cron AND next_tick IS NULL;

-- name: CronsDue :many
-- Ticks due by database time of live workers, oldest first, with what dispatching them needs: at
-- most @per_organization of each organization's, so that one organization's backlog never hides
-- another's due ticks from a pass.
SELECT d.worker_uid, d.cron, d.due, d.now, d.organization_id, d.space, d.name, d.script_name, d.installation
FROM (SELECT c.worker_uid, c.cron, c.next_tick::timestamptz AS due, db_now()::timestamptz AS now,
             w.organization_id, w.space, w.name, w.script_name, w.installation,
             row_number() OVER (PARTITION BY w.organization_id ORDER BY c.next_tick) AS rank
      FROM worker_crons c
      JOIN workers w ON w.uid = c.worker_uid
      WHERE c.next_tick <= (SELECT db_now()) AND w.status = 'live') d
WHERE d.rank <= @per_organization::bigint
ORDER BY d.due
LIMIT @max_rows;

-- name: CronClaim :execrows
-- The compare-and-swap that claims the tick due at @due: only the replica that moves next_tick
-- from it claims it.
UPDATE worker_crons SET next_tick = @next_tick::timestamptz
WHERE worker_uid = @worker_uid AND cron = @cron AND next_tick = @due::timestamptz;

-- name: CronTickInsert :exec
INSERT INTO cron_ticks (id, worker_uid, cron, scheduled_for, outcome, missed, detail, finished_at)
VALUES (@id, @worker_uid, @cron, @scheduled_for, @outcome, @missed, @detail,
        CASE WHEN @outcome::cron_tick_outcome = 'claimed' THEN NULL ELSE db_now() END);

-- name: CronTickFinish :exec
UPDATE cron_ticks SET outcome = @outcome, detail = @detail, finished_at = db_now()
WHERE id = @id AND outcome = 'claimed';

-- name: CronTicksTrim :execrows
-- A worker's ticks beyond its last 100.
DELETE FROM cron_ticks d
WHERE d.worker_uid = @worker_uid
  AND d.id NOT IN (SELECT t.id FROM cron_ticks t WHERE t.worker_uid = d.worker_uid
                   ORDER BY t.scheduled_for DESC, t.claimed_at DESC LIMIT 100);

-- name: InstallationCronCount :one
-- The crons of a Cloudflare installation's workers but @writing's, counted under the
-- installation's script-slot locks (held until the transaction ends).
SELECT installation_cron_count(@installation::text, @writing::uuid)::bigint AS crons;

-- name: CronTicksAbandoned :execrows
-- Ticks claimed more than @after_seconds ago whose outcome no Host recorded: the replica that claimed them
-- stopped. They are failed; the node may or may not have run them (it runs a tick id once).
UPDATE cron_ticks
SET outcome = 'failed', finished_at = (SELECT db_now()),
    detail = 'the Host that claimed this tick stopped before it recorded what became of it; the node may have run it, once at most'
WHERE outcome = 'claimed' AND scheduled_for < (SELECT db_now()) - make_interval(secs => @after_seconds::double precision);
