-- The Host's reconciler of runtime nodes (issue 34 item 2). A node can lose its state, come back
-- from an old backup, or outlive a database restored to an earlier point; the janitor then compares
-- what each node holds with the ledger and puts the node back: it writes again what the ledger
-- says is live and the node lacks (restored), takes down what the ledger says was deleted
-- (removed), and takes down what the ledger has no record of at all (fenced: a database restored
-- to before it was written). Each of those is recorded here, the reconciler's part of the operation
-- ledger: a fenced object may belong to an organization the restored database no longer knows, so
-- its record names the organization as the node labelled it, not by reference.
CREATE TYPE node_reconciliation_action AS ENUM ('restored', 'removed', 'fenced');

CREATE TABLE node_reconciliations (
    id            uuid PRIMARY KEY,
    installation  text NOT NULL,
    -- worker (a script) or endpoint (a route), and its name on the node.
    native_kind   text NOT NULL CHECK (native_kind IN ('worker', 'endpoint')),
    native_name   text NOT NULL,
    action        node_reconciliation_action NOT NULL,
    -- What the node held or was given: the deployment and the worker's or endpoint's UID (as the
    -- node recorded them for fenced objects, which may not parse as UUIDs), the organization's
    -- label and the generation.
    deployment_id text NOT NULL,
    resource_uid  text NOT NULL,
    organization  text NOT NULL DEFAULT '',
    generation    bigint NOT NULL DEFAULT 0,
    detail        text NOT NULL DEFAULT '',
    at            timestamptz NOT NULL DEFAULT db_now()
);

CREATE INDEX node_reconciliations_at_idx ON node_reconciliations (installation, at);

-- The reconciler's view of an installation: its active deployments.
CREATE INDEX deployments_active_installation_idx ON deployments (installation) WHERE status = 'active';
