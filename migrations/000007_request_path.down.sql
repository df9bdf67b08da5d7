DROP INDEX worker_endpoint_origin_reservations_minted_worker_idx;
DROP INDEX workers_deleted_script_idx;
DROP INDEX worker_endpoints_creating_operation_idx;
DROP INDEX workers_creating_operation_idx;
DROP FUNCTION quota_check;
CREATE OR REPLACE FUNCTION ownership_lock(org text, key_kind text, key text, caller_token text, wait text,
                                          brake_space text, brake_worker text)
RETURNS TABLE (entry text, token text, request_hash bytea, uid uuid, status integer, body bytea)
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM set_config('lock_timeout', wait, true);
    PERFORM pg_advisory_xact_lock(hashtextextended(org || '/' || key_kind || '/' || key, 0));
    RETURN QUERY
    SELECT 'binding', b.token, b.request_hash, b.object_uid, b.response_status, b.response_body
    FROM ownership_bindings b
    WHERE b.organization_id = org AND b.kind = key_kind AND b.external_key = key
    UNION ALL
    SELECT 'tombstone', t.token, t.request_hash, t.object_uid, t.response_status, t.response_body
    FROM ownership_tombstones t
    WHERE t.organization_id = org AND t.kind = key_kind AND t.external_key = key
      AND t.token = caller_token AND t.expires_at > db_now()
    UNION ALL
    SELECT 'intent', i.holder, ''::bytea, i.operation_id, CASE WHEN i.lease_expires_at <= db_now() THEN 1 ELSE 0 END, ''::bytea
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
DROP FUNCTION reservation_effective_status(text, timestamptz, uuid, timestamptz);
DROP FUNCTION reservation_fences(text, text, text, uuid, timestamptz);
DROP FUNCTION worker_fences(text, text, uuid, timestamptz);
CREATE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid,
                                              OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean,
                                              OUT attestation_open boolean, OUT deployment_live boolean)
LANGUAGE sql STABLE AS $$
SELECT reservation_status = 'activated',
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > db_now()),
       EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
               WHERE e.uid = witness
                 AND resource_present(e.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND a.status = 'open'),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness AND d.status NOT IN ('deleted', 'failed')
                 AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                             WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
$$;
CREATE FUNCTION worker_fences(org text, reservation_id text, worker uuid,
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
                 AND p.status = 'claimed' AND p.claim_expires_at > db_now())
$$;
CREATE FUNCTION reservation_effective_status(reservation_status text, expires_at timestamptz, witness uuid) RETURNS text
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF reservation_status IN ('prepared', 'bound') AND expires_at <= db_now()
       AND NOT reservation_published(reservation_status, witness) THEN
        RETURN 'expired';
    END IF;
    RETURN reservation_status;
END
$$;
