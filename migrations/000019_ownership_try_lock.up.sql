-- The lock step that is also the first read of an owned request (SPEC 3.2). With try_only it takes
-- the key's lock only when the lock is free. When another request holds it, it reads without it
-- what a replay is answered from (the key's binding and this token's tombstone, as the lookup of
-- earlier versions did) and adds a 'busy' entry, so that a replay never waits on a request in
-- flight and a new request holds the key from its first round trip. Without try_only it waits for
-- the lock, as migration 7's function does; that seven-argument function stays for Hosts that are
-- not upgraded yet.
CREATE FUNCTION ownership_lock(org text, key_kind text, key text, caller_token text, wait text,
                               brake_space text, brake_worker text, try_only boolean)
RETURNS TABLE (entry text, token text, request_hash bytea, uid uuid, status integer, body bytea)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at timestamptz;
    held boolean;
BEGIN
    -- The transaction's lock timeout, for this lock and every lock after it.
    PERFORM set_config('lock_timeout', wait, true);
    IF try_only THEN
        held := pg_try_advisory_xact_lock(hashtextextended(org || '/' || key_kind || '/' || key, 0));
    ELSE
        PERFORM pg_advisory_xact_lock(hashtextextended(org || '/' || key_kind || '/' || key, 0));
        held := true;
    END IF;
    at := db_now();
    -- Without the lock only what a replay is answered from is read; the lease and the brake are
    -- read under it.
    RETURN QUERY
    SELECT 'busy', ''::text, ''::bytea, '00000000-0000-0000-0000-000000000000'::uuid, 0, ''::bytea
    WHERE NOT held
    UNION ALL
    SELECT 'binding', b.token, b.request_hash, b.object_uid, b.response_status, b.response_body
    FROM ownership_bindings b
    WHERE b.organization_id = org AND b.kind = key_kind AND b.external_key = key
    UNION ALL
    SELECT 'tombstone', t.token, t.request_hash, t.object_uid, t.response_status, t.response_body
    FROM ownership_tombstones t
    WHERE t.organization_id = org AND t.kind = key_kind AND t.external_key = key
      AND t.token = caller_token AND t.expires_at > at
    UNION ALL
    SELECT 'intent', i.holder, ''::bytea, i.operation_id, CASE WHEN i.lease_expires_at <= at THEN 1 ELSE 0 END, ''::bytea
    FROM ownership_intents i
    WHERE held AND i.organization_id = org AND i.kind = key_kind AND i.external_key = key
    UNION ALL
    SELECT 'brake', b.scope, ''::bytea, '00000000-0000-0000-0000-000000000000'::uuid, 0, ''::bytea
    FROM deployment_brakes b
    WHERE held AND brake_worker IS NOT NULL
      AND (b.organization_id IS NULL
           OR (b.organization_id = org AND (b.space IS NULL OR (b.space = brake_space AND b.worker_name = brake_worker))));
END
$$;
