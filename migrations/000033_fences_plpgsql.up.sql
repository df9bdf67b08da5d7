-- The fences of a reservation and of its bound worker (SPEC 3.3), as PL/pgSQL: a SQL function
-- that cannot be inlined (these return several columns) is planned again on every call, and that
-- planning was most of what binding a reservation cost PostgreSQL (about 2 ms for each of the two
-- on a Host of 1,000 workers). PL/pgSQL keeps its plans for the connection. Same arguments, same
-- answers.

CREATE OR REPLACE FUNCTION worker_fences(org text, reservation_id text, worker uuid, at timestamptz,
                                         OUT worker_present boolean, OUT attestation_open boolean,
                                         OUT deployment_live boolean, OUT lease_claimed boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    worker_present := EXISTS (SELECT 1 FROM workers w JOIN operations o ON o.id = w.operation_id
                              WHERE w.uid = worker AND resource_present(w.status, o.status));
    attestation_open := EXISTS (SELECT 1 FROM deletion_attestations a
                                WHERE a.uid = worker AND attestation_open(a.status, a.closes_at, at));
    deployment_live := EXISTS (SELECT 1 FROM deployments d
                               WHERE d.resource_uid = worker
                                 AND ((d.status NOT IN ('deleted', 'failed')
                                       AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                                                   WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
                                      OR (d.status = 'deleted' AND d.routed_until > at)));
    lease_claimed := EXISTS (SELECT 1 FROM runtime_input_preparations p
                             WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                               AND p.status = 'claimed' AND p.claim_expires_at > at);
END
$$;

CREATE OR REPLACE FUNCTION reservation_fences(org text, reservation_id text, reservation_status reservation_status,
                                              witness uuid, at timestamptz,
                                              OUT activation boolean, OUT lease_claimed boolean,
                                              OUT endpoint_present boolean, OUT attestation_open boolean,
                                              OUT deployment_live boolean)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    activation := reservation_status = 'activated';
    lease_claimed := EXISTS (SELECT 1 FROM runtime_input_preparations p
                             WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                               AND p.status = 'claimed' AND p.claim_expires_at > at);
    endpoint_present := EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
                                WHERE e.uid = witness AND resource_present(e.status, o.status));
    attestation_open := EXISTS (SELECT 1 FROM deletion_attestations a
                                WHERE a.uid = witness AND attestation_open(a.status, a.closes_at, at));
    deployment_live := EXISTS (SELECT 1 FROM deployments d
                               WHERE d.resource_uid = witness
                                 AND ((d.status NOT IN ('deleted', 'failed')
                                       AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                                                   WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
                                      OR (d.status = 'deleted' AND d.routed_until > at)));
END
$$;
