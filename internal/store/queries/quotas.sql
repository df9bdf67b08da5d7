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
