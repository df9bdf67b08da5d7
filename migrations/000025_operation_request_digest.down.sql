ALTER TABLE operations DROP COLUMN request_digest;
