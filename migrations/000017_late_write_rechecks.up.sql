-- Late writes on backends without fences (SPEC 8, issue 22). A Cloudflare upload has no condition
-- a Host can attach to it: one that a stopped Host (or a Host whose call timed out) sent may still
-- land after the Host read the script back absent and abandoned the create. One read of absence is
-- therefore not final there. Whoever decides an apply did not land (recovery, or a request whose
-- call got no answer) records here, in the transaction that decides it, a re-check of that script
-- due once the backend's longest call could have ended; the janitor reads the script again then and
-- takes down a script that landed late for a worker that no longer stands. The script says whose it
-- is (its TAKOFORM_WORKER_UID binding), and the re-check never touches another worker's.
--
-- While a re-check of a script name is pending, no new worker takes that name (the create is
-- refused, retryable): a late upload can then never overwrite a newer worker's script, and the
-- re-check never has to choose between two workers.
-- pending, then what the re-check read: absent (nothing landed), removed (it landed for a worker
-- that no longer stands and was taken down), kept (the worker stands and the script is its own),
-- others (another worker holds the name; untouched), unobservable (the installation left the
-- catalog).
CREATE TYPE late_write_status AS ENUM ('pending', 'absent', 'removed', 'kept', 'others', 'unobservable');

CREATE TABLE late_write_rechecks (
    -- The deployment whose upload may land late: one re-check each (recording it again is a no-op).
    deployment_id   uuid PRIMARY KEY,
    organization_id text NOT NULL,
    installation    text NOT NULL,
    script_name     text NOT NULL,
    -- The worker the late upload would stamp into the script.
    worker_uid      uuid NOT NULL,
    -- Not before: the decision's database time plus the backend's longest call and a margin.
    due_at          timestamptz NOT NULL,
    -- A janitor working on it; another one takes it over only once this has passed.
    claimed_until   timestamptz NOT NULL DEFAULT '-infinity',
    status          late_write_status NOT NULL DEFAULT 'pending',
    detail          text,
    created_at      timestamptz NOT NULL DEFAULT db_now(),
    settled_at      timestamptz
);

CREATE INDEX late_write_rechecks_due_idx ON late_write_rechecks (due_at) WHERE status = 'pending';
CREATE INDEX late_write_rechecks_script_idx ON late_write_rechecks (installation, script_name) WHERE status = 'pending';
