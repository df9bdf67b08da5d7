-- Service bindings between workers (issue 17): one row per binding of a caller's current generation,
-- naming its callee. The binding itself lives in the caller's settings; this table is its index
-- for the other direction, so that a worker's delete finds the live workers that bind to it
-- (409 worker_has_callers). A caller's put writes its rows under the lock of every callee, taken
-- in UID order, and a delete checks for callers under its own row's lock: one of the two waits for
-- the other, so a binding to a worker being deleted and that delete never both succeed.
CREATE TABLE worker_service_bindings (
    caller_uid uuid NOT NULL REFERENCES workers (uid) ON DELETE CASCADE,
    binding text NOT NULL,
    callee_uid uuid NOT NULL REFERENCES workers (uid) ON DELETE CASCADE,
    PRIMARY KEY (caller_uid, binding)
);
CREATE INDEX worker_service_bindings_callee ON worker_service_bindings (callee_uid);

-- Workers bound before this table existed have none: bindings did not exist then.
