-- Custom domains (SPEC 3.7): an organization's claim on a DNS name, verified by a TXT record whose
-- value is an HMAC under a Host secret of its own (host_secrets), so that deleting and creating a
-- claim again needs no new record.
CREATE TYPE custom_domain_status AS ENUM ('pending', 'verified', 'failed', 'revoked');

CREATE TABLE custom_domains (
    organization_id  text NOT NULL REFERENCES organizations (id),
    hostname         text NOT NULL CHECK (hostname ~ '^(\*\.)?[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)+$' AND length(hostname) <= 255),
    uid              uuid NOT NULL UNIQUE,
    revision         bigint NOT NULL DEFAULT 1 CHECK (revision > 0),
    status           custom_domain_status NOT NULL,
    -- Why the last check ended as it did (a DNS answer, a resolver error, a name taken), shown as
    -- the claim's condition.
    message          text NOT NULL DEFAULT '',
    verified_at      timestamptz,
    -- Checks: the next one due, how many ran, and how many verified ones in a row found the record
    -- absent (seven revoke it; a resolver error counts for nothing).
    next_check_at    timestamptz NOT NULL,
    checks           integer NOT NULL DEFAULT 0,
    absent_in_a_row  integer NOT NULL DEFAULT 0,
    checked_at       timestamptz,
    -- A pending claim that is not verified by then fails.
    pending_until    timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (organization_id, hostname),
    CHECK ((status = 'verified') = (verified_at IS NOT NULL) OR status = 'revoked')
);

-- One organization per hostname, decided by verification: pending claims of several organizations
-- may coexist, and the first to verify holds the name.
CREATE UNIQUE INDEX custom_domains_verified_key ON custom_domains (hostname) WHERE status = 'verified';

-- The checker's queue: the claims due for a look, pending and verified alike.
CREATE INDEX custom_domains_due ON custom_domains (next_check_at) WHERE status IN ('pending', 'verified');

-- The janitor's pass over revoked claims (what still stands on them is let go).
CREATE INDEX custom_domains_revoked ON custom_domains (organization_id, hostname) WHERE status = 'revoked';

-- Secrets of the Host that never rotate, each wrapped by the key-encryption key under an AAD of
-- its own name (sealing): the custom-domain challenge secret first.
CREATE TABLE host_secrets (
    name           text PRIMARY KEY,
    kek_id         text NOT NULL,
    wrapped_secret bytea NOT NULL,
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- A reservation may hold a custom hostname instead of a label under the offering's suffix: custom
-- domain names the claim it stands under (the hostname itself, or the wildcard that covers it).
ALTER TABLE worker_endpoint_origin_reservations ADD COLUMN hostname text;
ALTER TABLE worker_endpoint_origin_reservations ADD COLUMN custom_domain text;
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_hostname_pair
    CHECK ((hostname IS NULL) = (custom_domain IS NULL));
CREATE INDEX worker_endpoint_origin_reservations_custom_domain
    ON worker_endpoint_origin_reservations (organization_id, custom_domain) WHERE custom_domain IS NOT NULL;
