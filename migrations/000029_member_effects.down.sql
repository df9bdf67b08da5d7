DROP INDEX backend_effects_member_inflight_idx;
DROP INDEX backend_effects_member_idx;
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_member_check, DROP COLUMN parent_id, DROP COLUMN node;
