-- Custody without holes, a stateless Host, and a request path that pins nothing (SPEC 2, 3.2-3.6).

-- Database time. Every query reads time through db_now(), so that a test can move the database's
-- notion of time forward (TTL expiry, lease expiry) for every Host process at once instead of
-- sleeping. A production database never has a row here.
CREATE TABLE clock_skew (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    skew      interval NOT NULL
);

-- PL/pgSQL caches the plan of its query once per session: called on every row of every statement,
-- it costs microseconds, where a SQL function with a subquery would be planned on every statement.
CREATE FUNCTION db_now() RETURNS timestamptz
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN now() + coalesce((SELECT skew FROM clock_skew), interval '0');
END
$$;

-- In-flight requests (SPEC 3.2, the idempotency-key pattern). A request whose effect spans several
-- transactions (it calls a backend between them) holds this row for its key, with a lease that
-- expires by database time and that its Host renews while it works. A Host that dies leaves a lease
-- that expires; whoever takes the key next recovers the operation first. Nothing here depends on a
-- database session, so no pooled connection is pinned and a dropped connection frees nothing.
CREATE TABLE ownership_intents (
    organization_id  text NOT NULL REFERENCES organizations (id),
    kind             text NOT NULL,
    external_key     text NOT NULL,
    operation_id     uuid NOT NULL REFERENCES operations (id),
    holder           text NOT NULL,
    lease_expires_at timestamptz NOT NULL,
    PRIMARY KEY (organization_id, kind, external_key)
);

CREATE INDEX ownership_intents_expiry_idx ON ownership_intents (lease_expires_at);

-- Only committed outcomes are bound (SPEC 3.2): a binding is written with its stored response in
-- the transaction that commits the outcome. Pending bindings of creates that never committed go;
-- their operations are left to recovery through an expired intent.
DELETE FROM ownership_bindings WHERE state = 'pending';

INSERT INTO ownership_intents (organization_id, kind, external_key, operation_id, holder, lease_expires_at)
SELECT DISTINCT ON (organization_id, kind, external_key) organization_id, kind, external_key, id, 'migration', '-infinity'
FROM operations
WHERE status = 'running'
ORDER BY organization_id, kind, external_key, started_at DESC;

ALTER TABLE ownership_bindings
    DROP CONSTRAINT ownership_bindings_response_check,
    DROP COLUMN state,
    ALTER COLUMN response_status SET NOT NULL,
    ALTER COLUMN response_body SET NOT NULL,
    ADD CONSTRAINT ownership_bindings_response_status_check CHECK (response_status BETWEEN 200 AND 299);

-- A create that never committed never existed: its rows are marked deleted when it is refused or
-- recovered, so that the partial unique indexes below hold only objects that may still stand.
UPDATE worker_endpoints e SET status = 'deleted', deleted_at = coalesce(e.deleted_at, now())
FROM operations o
WHERE o.id = e.operation_id AND e.status = 'creating' AND o.status <> 'running';

UPDATE workers w SET status = 'deleted', deleted_at = coalesce(w.deleted_at, now())
FROM operations o
WHERE o.id = w.operation_id AND w.status = 'creating' AND o.status <> 'running';

-- No two endpoints that may stand share a canonical origin (SPEC 3.3).
CREATE UNIQUE INDEX worker_endpoints_origin_key ON worker_endpoints (canonical_origin) WHERE status <> 'deleted';

-- An effect whose backend cannot be observed any more (its installation left the catalog) is
-- recorded as such rather than retried for ever.
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_status_check,
    ADD CONSTRAINT backend_effects_status_check CHECK (status IN ('planned', 'dispatched', 'succeeded', 'failed', 'unobservable'));

-- Deployment brakes are scoped (SPEC 3.6): the whole Host (no organization), one organization, or
-- one worker of it. A row is an engaged brake. The lifecycle brake belongs to the runtime node.
CREATE TABLE deployment_brakes (
    scope           text PRIMARY KEY,
    organization_id text REFERENCES organizations (id),
    space           text,
    worker_name     text,
    engaged_at      timestamptz NOT NULL DEFAULT now(),
    CHECK ((space IS NULL) = (worker_name IS NULL)),
    CHECK (organization_id IS NOT NULL OR space IS NULL)
);

INSERT INTO deployment_brakes (scope) SELECT '*' FROM brakes WHERE name = 'deployment' AND engaged;

DROP TABLE brakes;

-- The sealing key ring lives here (SPEC 3.5), each data key wrapped (AES-256-GCM) by the
-- key-encryption key every Host replica is given by its operator. A dump of this table opens
-- nothing without that key. One key is current; a bounded number of previous ones may still open
-- rows prepared or claimed before a rotation; a retired key's material is destroyed.
CREATE TABLE sealing_keys (
    id          text PRIMARY KEY CHECK (id ~ '^k[0-9]{14}-[0-9a-f]{8}$'),
    status      text NOT NULL CHECK (status IN ('current', 'previous', 'retired')),
    -- Fingerprint of the key-encryption key that wrapped it, for a clear refusal at start-up.
    kek_id      text NOT NULL,
    wrapped_key bytea,
    created_at  timestamptz NOT NULL DEFAULT now(),
    retired_at  timestamptz,
    CHECK ((status = 'retired') = (wrapped_key IS NULL))
);

CREATE UNIQUE INDEX sealing_keys_one_current ON sealing_keys ((true)) WHERE status = 'current';

-- Runtime inputs sealed under the per-Host file rings of earlier versions cannot be opened by a
-- ring in the database, and their digests predate the challenge readback: a prepared or claimed one
-- fails closed here (its owner prepares anew by bumping bindings_wo_version). Settled, aborted and
-- expired rows hold no values and need nothing.
UPDATE runtime_input_preparations
SET status = 'failed', epoch = epoch + 1, sealing_key_id = NULL, sealing_nonce = NULL, ciphertext = NULL,
    failure = 'sealed under a Host-local key ring that this version no longer reads; bump bindings_wo_version to prepare it again',
    updated_at = now()
WHERE status IN ('prepared', 'claimed', 'dispatched');

CREATE UNIQUE INDEX runtime_input_preparations_reference_key ON runtime_input_preparations (organization_id, reference);

-- The absence fences of a reservation's release and of the in-place witness clear (SPEC 3.3), on
-- database time. See migration 3 for what each fence means.
CREATE OR REPLACE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid,
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

-- Whether a reservation's bound worker is provably gone (SPEC 3.3, replacement keeps the
-- reservation): its row absent, its deletion attestation closed, no live deployment of it, and no
-- unexpired claimed lease on the reservation. Each fence is reported so a refusal can name it.
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

-- Whether a reservation has published: activated, or its recorded endpoint may still stand. A
-- published row does not age (SPEC 3.3): the TTL bounds a hold that has not published.
CREATE FUNCTION reservation_published(reservation_status text, witness uuid) RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN reservation_status = 'activated'
        OR (witness IS NOT NULL AND EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
                                            WHERE e.uid = witness AND resource_present(e.status, o.status)));
END
$$;

-- The lock step of every owned mutation (SPEC 3.2), in one round trip: bound its wait by
-- lock_timeout, take the key's transaction-scoped advisory lock (it pins nothing beyond this
-- transaction and is gone when it ends, crash included), then read, under the lock and with a
-- fresh snapshot, what is recorded for the key: one row per entry that exists, 'binding' (the
-- owner and stored response), 'tombstone' (this token's deleted object) and 'intent' (a request in
-- flight: uid is its operation, status 1 when its lease expired), and 'brake' when a deployment
-- brake covers the worker the mutation changes (brake_worker null: the caller checks itself).
-- Locks are taken in one order everywhere: this key lock first, then rows in the order workers,
-- worker_endpoints, worker_endpoint_origin_reservations, runtime_input_preparations, deployments.
CREATE FUNCTION ownership_lock(org text, key_kind text, key text, caller_token text, wait text,
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
    -- A deployment brake covering the mutation's worker (SPEC 3.6), when the caller names one.
    SELECT 'brake', b.scope, ''::bytea, '00000000-0000-0000-0000-000000000000'::uuid, 0, ''::bytea
    FROM deployment_brakes b
    WHERE brake_worker IS NOT NULL
      AND (b.organization_id IS NULL
           OR (b.organization_id = org AND (b.space IS NULL OR (b.space = brake_space AND b.worker_name = brake_worker))));
END
$$;

-- A reservation's status as of database time (SPEC 3.3, lazy expiry): a prepared or bound row
-- whose TTL passed is expired unless it has published. Reads compute it; only writes store it.
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

-- Workers and endpoints as every read derives them (SPEC 3.6): whether the row stands, and the
-- status of the current generation's latest deployment. Readiness is computed from these on every
-- read, never stored.
CREATE VIEW worker_states AS
SELECT w.*, resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = w.uid AND d.generation = w.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = w.uid AND d.generation = w.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id,
       p.status AS runtime_input_status,
       p.worker_uid AS runtime_input_worker_uid
FROM workers w
JOIN operations o ON o.id = w.operation_id
LEFT JOIN runtime_input_preparations p ON p.organization_id = w.organization_id AND p.reference = w.runtime_input_reference;

CREATE VIEW endpoint_states AS
SELECT e.*, resource_present(e.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = e.uid AND d.generation = e.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = e.uid AND d.generation = e.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id;

-- A deployment's sequence orders the deployments of one resource for its backend (a later one is
-- always larger, so a late copy of an older call never reverts a newer one), and a route's
-- deployment remembers the script it sends to, which its compare-and-delete names.
ALTER TABLE deployments
    ADD COLUMN seq bigserial NOT NULL,
    ADD COLUMN route_script text;

-- The ledger tables name their organization without a foreign key: every owned mutation writes
-- them, and a foreign key would take a share lock on the organization's one row in each of those
-- writes, which serializes an organization's concurrent requests on that row. Their organization
-- ids come from authenticated keys, and organizations are never deleted.
ALTER TABLE operations DROP CONSTRAINT operations_organization_id_fkey;
ALTER TABLE ownership_bindings DROP CONSTRAINT ownership_bindings_organization_id_fkey;
ALTER TABLE ownership_tombstones DROP CONSTRAINT ownership_tombstones_organization_id_fkey;
ALTER TABLE ownership_intents DROP CONSTRAINT ownership_intents_organization_id_fkey;
