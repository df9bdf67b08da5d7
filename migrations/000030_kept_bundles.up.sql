-- The bundle of a worker's active deployment when the worker's row has moved on to a newer
-- generation that is not active (its update failed, or is in flight): the node reconciler writes it
-- to a node that lacks it (one that joined the pool, or lost its state), so that every member runs
-- what the others run. Kept from the update that moves the row on, until that deployment is no
-- longer active.
CREATE TABLE worker_kept_bundles (
    deployment_id           uuid PRIMARY KEY REFERENCES deployments (id),
    worker_uid              uuid NOT NULL,
    modules                 jsonb NOT NULL,
    main_module             text NOT NULL,
    compatibility_date      text NOT NULL,
    settings                jsonb NOT NULL,
    required_sensitive_vars text[] NOT NULL
);

CREATE INDEX worker_kept_bundles_worker_idx ON worker_kept_bundles (worker_uid);
