DROP INDEX backend_effects_member_inflight_idx;
DROP INDEX backend_effects_member_idx;
-- Without their columns the members' effects would read as effects of their own.
DELETE FROM backend_effects WHERE parent_id IS NOT NULL;
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_member_check, DROP COLUMN parent_id, DROP COLUMN node;
