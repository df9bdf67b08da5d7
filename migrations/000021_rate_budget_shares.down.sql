DROP FUNCTION rate_budget_take_shared(text, text, integer, double precision, double precision, double precision, timestamptz);
DELETE FROM cloudflare_rate_budgets WHERE installation LIKE '%/org/%';
