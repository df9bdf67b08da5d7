-- Organizations own API keys, spaces and everything in them. id is the immutable tenantRef used
-- in every derivation; name is what operators type.
CREATE TABLE organizations (
    id         text PRIMARY KEY CHECK (id ~ '^org_[a-z0-9]{8,40}$'),
    name       text NOT NULL UNIQUE CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    created_at timestamptz NOT NULL DEFAULT now()
);

-- API keys are shown once and stored as a SHA-256 of the secret (the secret is 256 random bits,
-- so a slow hash adds nothing). Revocation is immediate: lookups ignore revoked rows.
CREATE TABLE api_keys (
    id              text PRIMARY KEY CHECK (id ~ '^key_[a-z0-9]{8,40}$'),
    organization_id text NOT NULL REFERENCES organizations (id),
    secret_hash     bytea NOT NULL UNIQUE CHECK (length(secret_hash) = 32),
    scopes          text[] NOT NULL CHECK (
        cardinality(scopes) > 0 AND scopes <@ ARRAY['resources:read', 'resources:write']::text[]
    ),
    created_at      timestamptz NOT NULL DEFAULT now(),
    revoked_at      timestamptz
);

CREATE INDEX api_keys_organization_idx ON api_keys (organization_id);

-- The ownership protocol (SPEC 3.2): one binding per live (organization, kind, external key),
-- holding the owning token, the hash of the request that produced the current state and the stored
-- response that a replay returns byte for byte. The primary key is what serializes concurrent
-- requests for one key across every Host process.
CREATE TABLE ownership_bindings (
    organization_id text NOT NULL REFERENCES organizations (id),
    kind            text NOT NULL,
    external_key    text NOT NULL,
    token           text NOT NULL CHECK (token ~ '^[A-Za-z0-9._~-]{16,128}$'),
    request_hash    bytea NOT NULL CHECK (length(request_hash) = 32),
    object_uid      uuid NOT NULL,
    response_status integer NOT NULL CHECK (response_status BETWEEN 200 AND 299),
    response_body   bytea NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, kind, external_key)
);

-- A delete moves the binding here. A replayed DELETE answers from the tombstone; a PUT carrying a
-- tombstoned token is refused with 410 so that a late replay never resurrects the object.
CREATE TABLE ownership_tombstones (
    organization_id text NOT NULL REFERENCES organizations (id),
    kind            text NOT NULL,
    external_key    text NOT NULL,
    token           text NOT NULL,
    object_uid      uuid NOT NULL,
    request_hash    bytea NOT NULL,
    response_status integer NOT NULL,
    response_body   bytea NOT NULL,
    deleted_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (organization_id, kind, external_key, token)
);

CREATE INDEX ownership_tombstones_expiry_idx ON ownership_tombstones (expires_at);

-- Reservations: value-free holds on one canonical origin (SPEC 3.3). Placement (offering, digest,
-- pack, installation) is stored for the fences and never projected.
CREATE TABLE worker_endpoint_origin_reservations (
    organization_id       text NOT NULL REFERENCES organizations (id),
    id                    text NOT NULL CHECK (id ~ '^[a-z0-9][a-z0-9-]{2,62}$' OR id ~ '^hostmint-[0-9a-f]{40}$'),
    uid                   uuid NOT NULL UNIQUE,
    format                text NOT NULL CHECK (format IN (
        'takoserver.worker-endpoint-origin-reservation.v1',
        'takoserver.worker-endpoint-origin-reservation.v2'
    )),
    space                 text NOT NULL CHECK (space ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    worker_name           text NOT NULL CHECK (worker_name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    subdomain             text NOT NULL,
    canonical_origin      text NOT NULL,
    ttl_seconds           integer NOT NULL CHECK (ttl_seconds > 0),
    revision              bigint NOT NULL DEFAULT 1 CHECK (revision > 0),
    status                text NOT NULL CHECK (status IN ('prepared', 'bound', 'activated', 'expired', 'released')),
    expires_at            timestamptz NOT NULL,
    host_minted           boolean NOT NULL DEFAULT false,
    bound_worker_uid      uuid,
    bound_worker_revision bigint,
    endpoint_uid          uuid,
    endpoint_revision     bigint,
    offering_id           text NOT NULL,
    offering_digest       text NOT NULL,
    pack                  text NOT NULL,
    installation          text NOT NULL,
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    released_at           timestamptz,
    PRIMARY KEY (organization_id, id),
    CHECK ((bound_worker_uid IS NULL) = (bound_worker_revision IS NULL)),
    CHECK ((endpoint_uid IS NULL) = (endpoint_revision IS NULL)),
    CHECK (status NOT IN ('bound', 'activated') OR bound_worker_uid IS NOT NULL),
    CHECK (status <> 'activated' OR endpoint_uid IS NOT NULL)
);

-- One live reservation per (organization, space, worker) and one owner per canonical origin across
-- every organization. A row holds both while it is live, or expired but still retaining an endpoint
-- witness (an old endpoint may still answer there).
CREATE UNIQUE INDEX worker_endpoint_origin_reservations_worker_key
    ON worker_endpoint_origin_reservations (organization_id, space, worker_name)
    WHERE status IN ('prepared', 'bound', 'activated') OR (status = 'expired' AND endpoint_uid IS NOT NULL);

CREATE UNIQUE INDEX worker_endpoint_origin_reservations_origin_key
    ON worker_endpoint_origin_reservations (canonical_origin)
    WHERE status IN ('prepared', 'bound', 'activated') OR (status = 'expired' AND endpoint_uid IS NOT NULL);
