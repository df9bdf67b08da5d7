ALTER TABLE api_keys DROP COLUMN expires_at, DROP COLUMN last_used_at;
