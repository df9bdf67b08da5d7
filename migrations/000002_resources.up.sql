-- The operation ledger (SPEC 3.6): every mutating request is an operation, running until it is
-- committed or refused. Fences read it: an effect whose operation was refused is settled.
CREATE TABLE operations (
    id              uuid PRIMARY KEY,
    organization_id text NOT NULL REFERENCES organizations (id),
    kind            text NOT NULL,
    external_key    text NOT NULL,
    method          text NOT NULL,
    status          text NOT NULL CHECK (status IN ('running', 'committed', 'refused')),
    code            text,
    replayed        boolean NOT NULL DEFAULT false,
    started_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,
    CHECK ((status = 'running') = (finished_at IS NULL))
);

CREATE INDEX operations_running_idx ON operations (organization_id, kind, external_key) WHERE status = 'running';

-- A binding is pending while its first effect is under way: the resource rows it names exist, the
-- response does not yet. The owner's retry resumes it; another token is refused.
ALTER TABLE ownership_bindings
    ADD COLUMN state text NOT NULL DEFAULT 'complete' CHECK (state IN ('pending', 'complete')),
    ALTER COLUMN response_status DROP NOT NULL,
    ALTER COLUMN response_body DROP NOT NULL,
    DROP CONSTRAINT ownership_bindings_response_status_check,
    ADD CONSTRAINT ownership_bindings_response_check CHECK (
        state = 'pending' OR (response_status BETWEEN 200 AND 299 AND response_body IS NOT NULL)
    );

-- Whether a worker or endpoint row stands: live or deleting, or being created by an operation
-- that is still running. A create whose operation was refused (or abandoned) never existed.
-- Reads, the destroy-order checks and the release fences all ask this one function.
CREATE FUNCTION resource_present(status text, operation_status text) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
SELECT status IN ('live', 'deleting') OR (status = 'creating' AND operation_status = 'running')
$$;

-- Placement is stored on every resource and deployment and compared by every fence.
CREATE TABLE workers (
    uid                     uuid PRIMARY KEY,
    organization_id         text NOT NULL REFERENCES organizations (id),
    space                   text NOT NULL CHECK (space ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name                    text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    generation              bigint NOT NULL DEFAULT 1 CHECK (generation > 0),
    revision                bigint NOT NULL DEFAULT 1 CHECK (revision > 0),
    modules                 jsonb NOT NULL,
    main_module             text NOT NULL,
    compatibility_date      text NOT NULL,
    required_sensitive_vars text[] NOT NULL DEFAULT '{}',
    runtime_input_reference text,
    script_name             text NOT NULL,
    offering_id             text NOT NULL,
    offering_digest         text NOT NULL,
    pack                    text NOT NULL,
    installation            text NOT NULL,
    -- creating: the create's operation has not committed; it is absent unless that operation is
    -- still running. live, deleting, deleted as usual.
    status                  text NOT NULL CHECK (status IN ('creating', 'live', 'deleting', 'deleted')),
    operation_id            uuid NOT NULL REFERENCES operations (id),
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    deleted_at              timestamptz
);

CREATE UNIQUE INDEX workers_live_key ON workers (organization_id, space, name) WHERE status <> 'deleted';

CREATE TABLE worker_endpoints (
    uid                   uuid PRIMARY KEY,
    organization_id       text NOT NULL REFERENCES organizations (id),
    space                 text NOT NULL CHECK (space ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    name                  text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    generation            bigint NOT NULL DEFAULT 1 CHECK (generation > 0),
    revision              bigint NOT NULL DEFAULT 1 CHECK (revision > 0),
    worker_uid            uuid NOT NULL REFERENCES workers (uid),
    worker_name           text NOT NULL,
    origin_reservation_id text NOT NULL,
    host_minted           boolean NOT NULL,
    canonical_origin      text NOT NULL,
    hostname              text NOT NULL,
    offering_id           text NOT NULL,
    offering_digest       text NOT NULL,
    pack                  text NOT NULL,
    installation          text NOT NULL,
    status                text NOT NULL CHECK (status IN ('creating', 'live', 'deleting', 'deleted')),
    operation_id          uuid NOT NULL REFERENCES operations (id),
    created_at            timestamptz NOT NULL DEFAULT now(),
    updated_at            timestamptz NOT NULL DEFAULT now(),
    deleted_at            timestamptz
);

CREATE UNIQUE INDEX worker_endpoints_live_key ON worker_endpoints (organization_id, space, name) WHERE status <> 'deleted';
CREATE INDEX worker_endpoints_worker_idx ON worker_endpoints (worker_uid) WHERE status <> 'deleted';

-- A deployment is one generation of a resource on its backend: pending -> active -> deleting ->
-- deleted | failed. Readiness is derived from these rows on every read.
CREATE TABLE deployments (
    id              uuid PRIMARY KEY,
    organization_id text NOT NULL REFERENCES organizations (id),
    resource_kind   text NOT NULL CHECK (resource_kind IN ('worker', 'endpoint')),
    resource_uid    uuid NOT NULL,
    generation      bigint NOT NULL,
    native_name     text NOT NULL,
    offering_id     text NOT NULL,
    offering_digest text NOT NULL,
    pack            text NOT NULL,
    installation    text NOT NULL,
    status          text NOT NULL CHECK (status IN ('pending', 'active', 'deleting', 'deleted', 'failed')),
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX deployments_resource_idx ON deployments (resource_uid, generation);

-- Backend effects hang off operations: planned -> dispatched -> succeeded | failed.
CREATE TABLE backend_effects (
    id            uuid PRIMARY KEY,
    operation_id  uuid NOT NULL REFERENCES operations (id),
    deployment_id uuid NOT NULL REFERENCES deployments (id),
    action        text NOT NULL CHECK (action IN ('apply', 'delete')),
    status        text NOT NULL CHECK (status IN ('planned', 'dispatched', 'succeeded', 'failed')),
    detail        text,
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX backend_effects_deployment_idx ON backend_effects (deployment_id);
CREATE INDEX backend_effects_operation_idx ON backend_effects (operation_id);

-- A deletion opens an attestation for the resource UID; it closes when the backend confirms
-- absence. No attestation at all reads as closed.
CREATE TABLE deletion_attestations (
    uid             uuid PRIMARY KEY,
    organization_id text NOT NULL REFERENCES organizations (id),
    resource_kind   text NOT NULL CHECK (resource_kind IN ('worker', 'endpoint')),
    status          text NOT NULL CHECK (status IN ('open', 'closed')),
    operation_id    uuid REFERENCES operations (id),
    opened_at       timestamptz NOT NULL DEFAULT now(),
    closed_at       timestamptz,
    CHECK ((status = 'closed') = (closed_at IS NOT NULL))
);

-- Brakes (SPEC 3.6): the deployment brake refuses graph-changing mutations with 423; the
-- lifecycle brake stops runtime restarts.
CREATE TABLE brakes (
    name       text PRIMARY KEY CHECK (name IN ('deployment', 'lifecycle')),
    engaged    boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO brakes (name) VALUES ('deployment'), ('lifecycle');
