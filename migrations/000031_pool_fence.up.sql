-- A pool's fenceSeconds, one value every Host replica and node command uses (SPEC 6.2): recorded
-- from the catalog by the pool's first node command, changed only by `takoserver nodes
-- set-fence`. Before it is recorded, the catalog's value is the pool's.
CREATE TABLE runtime_pools (
    installation  text PRIMARY KEY,
    fence_seconds integer NOT NULL CHECK (fence_seconds >= 0),
    changed_at    timestamptz NOT NULL,
    -- Who set it last (`nodes set-fence --by`), or "catalog" when recorded from the catalog.
    changed_by    text NOT NULL
);
