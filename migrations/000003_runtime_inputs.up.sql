-- Runtime-input preparations (SPEC 3.5): sealed secret bindings for one worker, delivered once
-- through a lease. Values exist here only as AES-256-GCM ciphertext, and only while the row is
-- prepared or claimed; dispatch clears it in the same compare-and-swap that authorizes delivery.
CREATE TABLE runtime_input_preparations (
    organization_id         text NOT NULL REFERENCES organizations (id),
    operation_id            text NOT NULL CHECK (operation_id ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
    preparation_id          text NOT NULL CHECK (preparation_id ~ '^prep-[0-9a-f]{32}$'),
    reference               text NOT NULL CHECK (reference ~ '^rip1\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$'),
    material_set_nonce      text NOT NULL,
    -- The Host-assigned id of the sealed material.
    material_set_id         uuid NOT NULL UNIQUE,
    space                   text NOT NULL,
    worker_name             text NOT NULL,
    bundle_name             text NOT NULL,
    endpoint_name           text NOT NULL,
    origin_reservation_id   text NOT NULL,
    canonical_public_origin text NOT NULL,
    binding_names           text[] NOT NULL,
    sealing_key_id          text,
    sealing_nonce           bytea,
    ciphertext              bytea,
    -- Keyed digest (HMAC) of the material, under the digest key of digest_key_id.
    material_digest         bytea NOT NULL CHECK (length(material_digest) = 32),
    digest_key_id           text NOT NULL,
    status                  text NOT NULL CHECK (status IN ('prepared', 'claimed', 'dispatched', 'settled', 'aborted', 'expired', 'failed')),
    -- Every transition is a compare-and-swap on epoch.
    epoch                   bigint NOT NULL DEFAULT 1,
    expires_at              timestamptz NOT NULL,
    -- The claim binds the lease to the exact worker incarnation, reservation revision and placement.
    claim_operation_id      uuid REFERENCES operations (id),
    worker_uid              uuid,
    worker_revision         bigint,
    reservation_revision    bigint,
    offering_id             text,
    offering_digest         text,
    pack                    text,
    installation            text,
    native_name             text,
    claimed_at              timestamptz,
    claim_expires_at        timestamptz,
    dispatched_at           timestamptz,
    settled_at              timestamptz,
    failure                 text,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, operation_id),
    UNIQUE (organization_id, preparation_id),
    CHECK ((status IN ('prepared', 'claimed')) = (ciphertext IS NOT NULL)),
    CHECK ((ciphertext IS NULL) = (sealing_nonce IS NULL) AND (ciphertext IS NULL) = (sealing_key_id IS NULL)),
    CHECK (status IN ('prepared', 'aborted', 'expired') OR worker_uid IS NOT NULL OR status = 'failed')
);

CREATE INDEX runtime_input_preparations_reservation_idx ON runtime_input_preparations (organization_id, origin_reservation_id) WHERE status = 'claimed';
CREATE INDEX runtime_input_preparations_worker_idx ON runtime_input_preparations (worker_uid) WHERE status = 'claimed';
CREATE INDEX runtime_input_preparations_claim_op_idx ON runtime_input_preparations (claim_operation_id) WHERE status IN ('claimed', 'dispatched');

-- The absence fences of a reservation's release and of the in-place witness clear (SPEC 3.3 and
-- 3.4), defined once and evaluated with the values of the caller's locked row:
--   activation        the reservation is activated;
--   lease_claimed     an unexpired claimed runtime-input lease names it;
--   endpoint_present  its retained endpoint exists (a create whose operation was refused never did);
--   attestation_open  that endpoint's deletion attestation is open (none at all reads as closed);
--   deployment_live   a deployment of that endpoint is outside deleted or failed, unless every one
--                     of its effects belongs to a refused operation and none succeeded.
CREATE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid,
                                   OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean,
                                   OUT attestation_open boolean, OUT deployment_live boolean)
LANGUAGE sql STABLE AS $$
SELECT reservation_status = 'activated',
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > now()),
       EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
               WHERE e.uid = witness
                 AND resource_present(e.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND a.status = 'open'),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness AND d.status NOT IN ('deleted', 'failed')
                 AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                             WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
$$;
