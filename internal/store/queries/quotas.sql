-- name: QuotaLock :many
-- Locks the organization's quota rows of the wanted resources (made on first use), in resource
-- order, for the rest of the transaction, and returns each one's override (null: the catalog's
-- default). Every create a ceiling bounds takes its row before it counts and inserts (SPEC 5.1).
SELECT l.resource::text AS resource, (l.ceiling IS NOT NULL)::boolean AS overridden, coalesce(l.ceiling, 0)::integer AS ceiling
FROM quota_lock(@organization_id::text, @resources::text[]) AS l;

-- name: QuotaCheck :one
-- The quota step of a create of one resource in one round trip (the quota_check function of
-- migrations 9 and 13): one of the organization's slots of the resource taken for the rest of the
-- transaction (all of them near the ceiling), its override (null: the catalog's default, given),
-- and what the organization holds of it, counted once the slots were granted.
SELECT c.overridden::boolean AS overridden, c.ceiling::integer AS ceiling, c.used::bigint AS used
FROM quota_check(@organization_id::text, @resource::text, (SELECT db_now()), @default_ceiling::integer) AS c;

-- name: QuotaUsage :one
-- What the organization holds of each resource a ceiling bounds, as of database time: workers and
-- endpoints that may stand (a create that never committed is marked deleted when it is refused),
-- reservations live as of now (lazy expiry computed, not written; released and expired ones do
-- not count), and runtime inputs still pending (prepared or claimed, their window not passed).
-- An operator's report (takoserver orgs quota); a create runs QuotaCheck.
SELECT
    (SELECT count(*) FROM workers w
     WHERE w.organization_id = @organization_id AND w.status <> 'deleted') AS workers,
    (SELECT count(*) FROM worker_endpoints e
     WHERE e.organization_id = @organization_id AND e.status <> 'deleted') AS endpoints,
    (SELECT count(*) FROM worker_endpoint_origin_reservations r
     WHERE r.organization_id = @organization_id AND r.status IN ('prepared', 'bound', 'activated')
       AND reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) IN ('prepared', 'bound', 'activated')) AS reservations,
    (SELECT count(*) FROM runtime_input_preparations p
     WHERE p.organization_id = @organization_id AND p.status IN ('prepared', 'claimed')
       AND ((p.status = 'prepared' AND p.expires_at > (SELECT db_now())) OR (p.status = 'claimed' AND p.claim_expires_at > (SELECT db_now())))) AS runtime_inputs;

-- name: QuotaOverrides :many
-- The organization's overrides, for an operator's report.
SELECT resource, ceiling FROM organization_quotas
WHERE organization_id = @organization_id AND ceiling IS NOT NULL;

-- name: QuotaSet :exec
-- Sets (or, with a null ceiling, removes) the organization's override of one resource.
INSERT INTO organization_quotas (organization_id, resource, ceiling, updated_at)
VALUES (@organization_id, @resource, sqlc.narg('ceiling'), now())
ON CONFLICT (organization_id, resource) DO UPDATE SET ceiling = excluded.ceiling, updated_at = excluded.updated_at;

-- name: QuotaUsageDrift :many
-- Every organization and resource whose counter shards (migration 18) do not sum to what the
-- statuses say it holds (without expiry): none, unless a write got past the row triggers. Read
-- under one snapshot (quota.CheckCounters).
WITH counted AS (
    SELECT u.organization_id, u.resource, sum(u.held)::bigint AS held FROM organization_usage u GROUP BY 1, 2
), actual AS (
    SELECT w.organization_id, 'workers'::text AS resource, count(*)::bigint AS held FROM workers w WHERE usage_counted('workers', w.status::text) GROUP BY 1
    UNION ALL
    SELECT e.organization_id, 'endpoints', count(*) FROM worker_endpoints e WHERE usage_counted('endpoints', e.status::text) GROUP BY 1
    UNION ALL
    SELECT r.organization_id, 'reservations', count(*) FROM worker_endpoint_origin_reservations r WHERE usage_counted('reservations', r.status::text) GROUP BY 1
    UNION ALL
    SELECT p.organization_id, 'runtime_inputs', count(*) FROM runtime_input_preparations p WHERE usage_counted('runtime_inputs', p.status::text) GROUP BY 1
)
SELECT coalesce(c.organization_id, a.organization_id)::text AS organization_id, coalesce(c.resource, a.resource)::text AS resource,
       coalesce(c.held, 0)::bigint AS counted, coalesce(a.held, 0)::bigint AS held
FROM counted c FULL JOIN actual a ON a.organization_id = c.organization_id AND a.resource = c.resource
WHERE coalesce(c.held, 0) <> coalesce(a.held, 0)
ORDER BY 1, 2;

-- name: QuotaUsageRecount :one
-- Makes every organization's quota counters again from its rows, writers held off meanwhile
-- (quota_usage_recount of migration 18): an operator's repair of a drift CheckCounters found.
SELECT quota_usage_recount()::bigint AS written;
