-- Service bindings of two generations (issue 17): a caller's update writes the bindings of its new
-- generation into the index before that generation is deployed, and keeps those of the one still
-- deployed until the new one is: a callee stays protected while any generation that may run still
-- names it, and a failed update that dropped a binding does not free the callee its running
-- deployment still calls. One binding name may then name two callees at once (AUTH moved from one
-- worker to another), so the key takes the callee too.
ALTER TABLE worker_service_bindings
    DROP CONSTRAINT worker_service_bindings_pkey,
    ADD PRIMARY KEY (caller_uid, binding, callee_uid);
