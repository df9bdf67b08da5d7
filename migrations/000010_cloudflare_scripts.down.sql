DROP FUNCTION installation_script_check(text, integer);
DROP FUNCTION installation_script_count(text);
DROP INDEX workers_installation_live_idx;
DROP TABLE installation_script_slots;
DROP FUNCTION rate_budget_block(text, interval, timestamptz);
DROP FUNCTION rate_budget_take(text, integer, double precision, double precision, timestamptz);
DROP TABLE cloudflare_rate_budgets;
ALTER TABLE runtime_input_preparations DROP COLUMN delivery_digest;
