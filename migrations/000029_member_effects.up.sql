-- A deployment on a selfhost pool is one backend effect per member (SPEC 6.2): the pack's effect
-- (node NULL) and, under it, one effect per member that may route, planned with it from the
-- membership rows read in the plan's transaction, and settled from what that member answered.
-- A member that joined between the plan and the call is recorded as it answered.
ALTER TABLE backend_effects
    ADD COLUMN node text,
    ADD COLUMN parent_id uuid REFERENCES backend_effects (id),
    ADD CONSTRAINT backend_effects_member_check CHECK ((node IS NULL) = (parent_id IS NULL));

CREATE UNIQUE INDEX backend_effects_member_idx ON backend_effects (parent_id, node) WHERE parent_id IS NOT NULL;

-- A node is removed only once no running operation has an effect in flight on it.
CREATE INDEX backend_effects_member_inflight_idx ON backend_effects (node) WHERE node IS NOT NULL AND status IN ('planned', 'dispatched');
