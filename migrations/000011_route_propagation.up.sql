-- Route propagation (SPEC 8, issue 16): a Cloudflare route that reads back deleted may still be
-- routed by the edge for the installation's routePropagationSeconds (KV caches, route
-- propagation). The route counts as deleted, fence deployment_live clears, and the deletion
-- attestation closes only once that window has passed since the readback. Both times are
-- persisted in the transaction that records the readback, so a Host that stops in between loses
-- nothing, and no timer is needed: every reader compares them with the time it reads at.

-- routed_until: a deleted deployment whose route the backend's edge may still serve until then.
ALTER TABLE deployments ADD COLUMN routed_until timestamptz;

-- closes_at: the attestation closes at this time (absence confirmed, propagation included); it
-- reads as open until then, and the janitor writes the status afterwards.
ALTER TABLE deletion_attestations ADD COLUMN closes_at timestamptz;

CREATE INDEX deletion_attestations_closing_idx ON deletion_attestations (closes_at) WHERE status = 'open' AND closes_at IS NOT NULL;

-- Whether an attestation is open as of `at`.
CREATE FUNCTION attestation_open(status text, closes_at timestamptz, at timestamptz) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
SELECT status = 'open' AND (closes_at IS NULL OR closes_at > at)
$$;

-- The absence fences of a reservation (migrations 4 and 7), as of `at`, counting a route's
-- propagation window in attestation_open and deployment_live.
CREATE OR REPLACE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid, at timestamptz,
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
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND attestation_open(a.status, a.closes_at, at)),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness
                 AND ((d.status NOT IN ('deleted', 'failed')
                       AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                                   WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
                      OR (d.status = 'deleted' AND d.routed_until > at)))
$$;

-- Whether a reservation's bound worker is provably gone (migrations 4 and 7), as of `at`, with
-- the same windows.
CREATE OR REPLACE FUNCTION worker_fences(org text, reservation_id text, worker uuid, at timestamptz,
                                         OUT worker_present boolean, OUT attestation_open boolean,
                                         OUT deployment_live boolean, OUT lease_claimed boolean)
LANGUAGE sql STABLE AS $$
SELECT EXISTS (SELECT 1 FROM workers w JOIN operations o ON o.id = w.operation_id
               WHERE w.uid = worker AND resource_present(w.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = worker AND attestation_open(a.status, a.closes_at, at)),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = worker
                 AND ((d.status NOT IN ('deleted', 'failed')
                       AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                                   WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
                      OR (d.status = 'deleted' AND d.routed_until > at))),
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > at)
$$;
