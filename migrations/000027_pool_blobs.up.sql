-- Secrets in a pool (SPEC 6.2): at dispatch, the CAS that clears the Host's ciphertext stores the
-- values sealed to the pool's public key (HPKE; the Host cannot open it), for the worker UID and
-- delivery it was dispatched to. The nodes open it; the Host names it again to a node that lost
-- its state. Kept only while the delivery may be the worker's current one: cleared when it fails,
-- when a newer delivery of the worker settles, and when the worker is gone.
ALTER TABLE runtime_input_preparations ADD COLUMN pool_blob bytea;
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_pool_blob_check
    CHECK (pool_blob IS NULL OR (status IN ('dispatched', 'settled') AND worker_uid IS NOT NULL));
-- The worker's blobs, found when a newer delivery settles, and the installation's, found by the
-- node reconciler: only rows that hold one.
CREATE INDEX runtime_input_preparations_pool_blob_idx ON runtime_input_preparations (worker_uid) WHERE pool_blob IS NOT NULL;
-- A worker's settled deliveries, which the reconciler compares with the one a node holds (a
-- node back from an old backup may hold a superseded one).
CREATE INDEX runtime_input_preparations_settled_worker_idx ON runtime_input_preparations (worker_uid, dispatched_at) WHERE status = 'settled';
