-- name: RateBudgetTake :one
-- Takes n calls of the installation's Cloudflare API budget as of database time (SPEC 8 "Rate
-- limits"); answers the seconds to wait, 0 when taken.
SELECT rate_budget_take(@installation::text, @n::integer, @capacity::double precision, @per_second::double precision, (SELECT db_now()))::double precision AS wait_seconds;

-- name: RateBudgetBlock :one
-- Records a 429's Retry-After: the installation takes nothing until it has passed.
SELECT rate_budget_block(@installation::text, make_interval(secs => @retry_seconds::double precision), (SELECT db_now()))::timestamptz AS blocked_until;

-- name: InstallationScriptCheck :one
-- The script-ceiling step of a worker create (SPEC 8): one of the installation's slots taken for
-- the rest of the transaction (all of them near the ceiling), then its scripts counted.
SELECT installation_script_check(@installation::text, @ceiling::integer)::bigint AS used;

-- name: RateBudgetTakeShared :one
-- Takes n calls of the installation's budget and of the organization's share of it (migration
-- 21); answers the seconds to wait, 0 when taken from both.
SELECT rate_budget_take_shared(@installation::text, @organization::text, @n::integer, @capacity::double precision,
       @per_second::double precision, @share::double precision, (SELECT db_now()))::double precision AS wait_seconds;
