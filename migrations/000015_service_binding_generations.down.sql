-- One callee per binding name again: a pending generation's rows for a name the deployed one also
-- binds go (the next put of the caller writes its bindings afresh).
DELETE FROM worker_service_bindings b
USING worker_service_bindings keep
WHERE keep.caller_uid = b.caller_uid AND keep.binding = b.binding AND keep.callee_uid < b.callee_uid;
ALTER TABLE worker_service_bindings
    DROP CONSTRAINT worker_service_bindings_pkey,
    ADD PRIMARY KEY (caller_uid, binding);
