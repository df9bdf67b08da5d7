-- The members of a selfhost pool (SPEC 6.2). Membership lives here, like every other authority:
-- the catalog names the pool and the address of its first node; `takoserver nodes` changes the
-- rows. An installation without rows is a pool of one, its node the catalog's runtimeUrl.
--   joining:  added; the node reconciler is bringing it up to date. It receives every change and
--             must confirm every absence, as a serving member does, but is not in the Ready set.
--   serving:  caught up: every worker of the pool is Ready only when Ready here too.
--   draining: leaving the pool: its health check fails, and it stops serving fenceSeconds after
--             changed_at. It still receives changes and must confirm every absence.
--   removed:  it confirmed it holds nothing (not built yet).
--   retired:  lost for good: the operator attested that it is fenced (out of DNS and the load
--             balancer) since fenced_since, at least the pool's fenceSeconds ago. Its absences
--             count as confirmed from then on; it never receives anything again.
CREATE TYPE runtime_node_state AS ENUM ('joining', 'serving', 'draining', 'removed', 'retired');

CREATE TABLE runtime_nodes (
    installation text NOT NULL,
    name         text NOT NULL CHECK (name ~ '^[a-z0-9][a-z0-9_-]{0,62}$'),
    url          text NOT NULL,
    state        runtime_node_state NOT NULL,
    -- The pool's epoch when the row last changed: retire bumps it on every member.
    pool_epoch   bigint NOT NULL DEFAULT 1,
    added_at     timestamptz NOT NULL DEFAULT now(),
    changed_at   timestamptz NOT NULL DEFAULT now(),
    fenced_since timestamptz,
    PRIMARY KEY (installation, name),
    CHECK ((state = 'retired') = (fenced_since IS NOT NULL))
);

-- No two members of a pool that may still route answer at one address.
CREATE UNIQUE INDEX runtime_nodes_live_url_idx ON runtime_nodes (installation, url) WHERE state NOT IN ('removed', 'retired');

-- Who changed the pool, when and why: an operator's attestation (retire --lost) is kept for good.
CREATE TABLE runtime_node_events (
    id           bigserial PRIMARY KEY,
    installation text NOT NULL,
    node         text NOT NULL,
    action       text NOT NULL CHECK (action IN ('add', 'serve', 'drain', 'remove', 'retire')),
    actor        text NOT NULL,
    at           timestamptz NOT NULL DEFAULT now(),
    detail       jsonb NOT NULL DEFAULT '{}'::jsonb,
    FOREIGN KEY (installation, node) REFERENCES runtime_nodes (installation, name)
);
