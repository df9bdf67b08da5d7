-- An API key's expiry (optional: keys create --expires-in) and its last use, for keys list
-- (issue 34 item 3). The last use is written at most once a minute per key, by the lookup that
-- authenticates it.
ALTER TABLE api_keys ADD COLUMN expires_at timestamptz, ADD COLUMN last_used_at timestamptz;
