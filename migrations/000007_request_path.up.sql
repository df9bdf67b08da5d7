-- A request path whose cost does not depend on the planner's luck (issue 15, STYLE 14).
--
-- Time is a value: the functions that decide by time take it as an argument, and the queries
-- read db_now() once per statement (an uncorrelated subquery, computed once before the rows) and
-- pass it in, so no statement reads clock_skew once per row of what it scans. db_now() and
-- clock_skew stay: tests still move every Host's time at once through them.

-- A reservation's status as of `at` (SPEC 3.3, lazy expiry).
CREATE FUNCTION reservation_effective_status(reservation_status text, expires_at timestamptz, witness uuid, at timestamptz) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF reservation_status IN ('prepared', 'bound') AND expires_at <= at
       AND NOT reservation_published(reservation_status, witness) THEN
        RETURN 'expired';
    END IF;
    RETURN reservation_status;
END
$$;

-- The absence fences of a reservation (migration 4), as of `at`.
CREATE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid, at timestamptz,
                                   OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean,
                                   OUT attestation_open boolean, OUT deployment_live boolean)
LANGUAGE sql STABLE AS $$
SELECT reservation_status = 'activated',
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > at),
       EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
               WHERE e.uid = witness
                 AND resource_present(e.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND a.status = 'open'),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness AND d.status NOT IN ('deleted', 'failed')
                 AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                             WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
$$;

-- Whether a reservation's bound worker is provably gone (migration 4), as of `at`.
CREATE FUNCTION worker_fences(org text, reservation_id text, worker uuid, at timestamptz,
                              OUT worker_present boolean, OUT attestation_open boolean,
                              OUT deployment_live boolean, OUT lease_claimed boolean)
LANGUAGE sql STABLE AS $$
SELECT EXISTS (SELECT 1 FROM workers w JOIN operations o ON o.id = w.operation_id
               WHERE w.uid = worker AND resource_present(w.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = worker AND a.status = 'open'),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = worker AND d.status NOT IN ('deleted', 'failed')
                 AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                             WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded'))),
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > at)
$$;

-- Every query now passes the time; the versions that read the clock themselves go.
DROP FUNCTION reservation_effective_status(text, timestamptz, uuid);
DROP FUNCTION reservation_fences(text, text, text, uuid);
DROP FUNCTION worker_fences(text, text, uuid);

-- The lock step of every owned mutation (migration 4), reading the clock once.
CREATE OR REPLACE FUNCTION ownership_lock(org text, key_kind text, key text, caller_token text, wait text,
                                          brake_space text, brake_worker text)
RETURNS TABLE (entry text, token text, request_hash bytea, uid uuid, status integer, body bytea)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    at timestamptz;
BEGIN
    PERFORM set_config('lock_timeout', wait, true);
    PERFORM pg_advisory_xact_lock(hashtextextended(org || '/' || key_kind || '/' || key, 0));
    at := db_now();
    RETURN QUERY
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
    WHERE i.organization_id = org AND i.kind = key_kind AND i.external_key = key
    UNION ALL
    SELECT 'brake', b.scope, ''::bytea, '00000000-0000-0000-0000-000000000000'::uuid, 0, ''::bytea
    FROM deployment_brakes b
    WHERE brake_worker IS NOT NULL
      AND (b.organization_id IS NULL
           OR (b.organization_id = org AND (b.space IS NULL OR (b.space = brake_space AND b.worker_name = brake_worker))));
END
$$;

-- The quota step of a create (SPEC 5.1) in one round trip: lock the organization's row of the
-- resource (made on first use), then, in a statement of its own (a volatile function's statements
-- each take a fresh snapshot, so it sees every create that committed before the lock was
-- granted), count what the organization holds of that resource as of `at`. Each count reads only
-- the organization's own rows through its partial index: the plan is made once for every
-- organization of the Host, and a generic plan shaped by one tenant with half the table must not
-- walk the table for all the others, so sequential scans are off inside.
CREATE FUNCTION quota_check(org text, wanted text, at timestamptz)
RETURNS TABLE (overridden boolean, ceiling integer, used bigint)
LANGUAGE plpgsql VOLATILE SET enable_seqscan = off AS $$
#variable_conflict use_column
DECLARE
    c integer;
    n bigint;
BEGIN
    INSERT INTO organization_quotas (organization_id, resource) VALUES (org, wanted) ON CONFLICT DO NOTHING;
    SELECT q.ceiling INTO c FROM organization_quotas q WHERE q.organization_id = org AND q.resource = wanted FOR UPDATE;
    CASE wanted
    WHEN 'workers' THEN
        SELECT count(*) INTO n FROM workers w WHERE w.organization_id = org AND w.status <> 'deleted';
    WHEN 'endpoints' THEN
        SELECT count(*) INTO n FROM worker_endpoints e WHERE e.organization_id = org AND e.status <> 'deleted';
    WHEN 'reservations' THEN
        SELECT count(*) INTO n FROM worker_endpoint_origin_reservations r
        WHERE r.organization_id = org AND r.status IN ('prepared', 'bound', 'activated')
          AND (r.status = 'activated' OR r.expires_at > at OR reservation_published(r.status, r.endpoint_uid));
    WHEN 'runtime_inputs' THEN
        SELECT count(*) INTO n FROM runtime_input_preparations p
        WHERE p.organization_id = org AND p.status IN ('prepared', 'claimed')
          AND ((p.status = 'prepared' AND p.expires_at > at) OR (p.status = 'claimed' AND p.claim_expires_at > at));
    END CASE;
    RETURN QUERY SELECT c IS NOT NULL, coalesce(c, 0), n;
END
$$;

-- Indexes for the request-path lookups that had none, each narrowed to the rows it looks for:
-- recovery's creates of an operation, the holder of a script name among deleted workers, and the
-- Host-minted rows of a worker that its delete releases.
CREATE INDEX workers_creating_operation_idx ON workers (operation_id) WHERE status = 'creating';
CREATE INDEX worker_endpoints_creating_operation_idx ON worker_endpoints (operation_id) WHERE status = 'creating';
CREATE INDEX workers_deleted_script_idx ON workers (installation, script_name) WHERE status = 'deleted';
CREATE INDEX worker_endpoint_origin_reservations_minted_worker_idx ON worker_endpoint_origin_reservations (bound_worker_uid)
    WHERE host_minted AND status IN ('prepared', 'bound', 'expired');
