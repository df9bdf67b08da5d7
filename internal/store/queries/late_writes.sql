-- name: LateWriteRecheckOpen :exec
-- Records, in the transaction that decides an upload did not land, the re-check of its script on
-- a backend without fences (migration 17), due after_seconds of database time from now. Recording
-- the same deployment again changes nothing.
INSERT INTO late_write_rechecks (deployment_id, organization_id, installation, script_name, worker_uid, due_at, created_at)
VALUES (@deployment_id, @organization_id, @installation, @script_name, @worker_uid,
        (SELECT db_now()) + make_interval(secs => @after_seconds::double precision), (SELECT db_now()))
ON CONFLICT (deployment_id) DO NOTHING;

-- name: LateWriteRechecksClaim :many
-- The janitor's due re-checks, each claimed for claim_seconds so that another replica skips it
-- meanwhile (one that outlives its claim is taken over; the re-check itself is idempotent). With
-- each, whether its worker still stands.
UPDATE late_write_rechecks r
SET claimed_until = (SELECT db_now()) + make_interval(secs => @claim_seconds::double precision)
FROM (SELECT c.deployment_id FROM late_write_rechecks c
      WHERE c.status = 'pending' AND c.due_at <= (SELECT db_now()) AND c.claimed_until <= (SELECT db_now())
      ORDER BY c.due_at
      LIMIT 20
      FOR UPDATE SKIP LOCKED) due
WHERE r.deployment_id = due.deployment_id
RETURNING r.deployment_id, r.organization_id, r.installation, r.script_name, r.worker_uid,
          EXISTS (SELECT 1 FROM workers w WHERE w.uid = r.worker_uid AND w.status <> 'deleted')::boolean AS worker_stands;

-- name: LateWriteRecheckSettle :execrows
-- Settles a pending re-check with what it read; only the first of two replicas settles it.
UPDATE late_write_rechecks
SET status = @status, detail = sqlc.narg('detail'), settled_at = (SELECT db_now())
WHERE deployment_id = @deployment_id AND status = 'pending';

-- name: LateWriteRecheckPending :one
-- Whether a re-check of the script name is still pending for a worker other than uid: a create
-- that would take the name waits for it (the answer is read after the create's row is written, so
-- that a re-check committed meanwhile is seen).
SELECT EXISTS (SELECT 1 FROM late_write_rechecks
               WHERE installation = @installation AND script_name = @script_name
                 AND worker_uid <> @uid AND status = 'pending')::boolean AS pending;
