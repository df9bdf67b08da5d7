-- name: CustomDomainRead :one
-- One claim of the organization with the owning token of its ownership key. Takes no lock.
SELECT sqlc.embed(c),
       COALESCE((SELECT b.token FROM ownership_bindings b
                 WHERE b.organization_id = c.organization_id AND b.kind = 'custom-domain' AND b.external_key = c.hostname), '')::text AS ownership_token
FROM custom_domains c
WHERE c.organization_id = @organization_id AND c.hostname = @hostname;

-- name: CustomDomainLock :one
SELECT * FROM custom_domains WHERE organization_id = @organization_id AND hostname = @hostname FOR UPDATE;

-- name: CustomDomainVerifiedElsewhere :one
-- Whether another organization verified hostname (its claim holds the name; SPEC 3.7).
SELECT EXISTS (SELECT 1 FROM custom_domains
               WHERE hostname = @hostname AND status = 'verified' AND organization_id <> @organization_id)::boolean AS taken;

-- name: CustomDomainCountLocked :one
-- How many claims the organization holds, counted under a transaction-level lock of its own, so
-- that two creates at the ceiling never both pass (SPEC 3.7's quota).
WITH locked AS MATERIALIZED (SELECT pg_advisory_xact_lock(hashtextextended('takoform custom domains ' || @organization_id::text, 0)))
SELECT count(*)::integer AS held FROM custom_domains, locked WHERE organization_id = @organization_id;

-- name: CustomDomainsHeld :one
-- How many claims the organization holds, for an operator's report (takoserver orgs quota).
SELECT count(*)::integer AS held FROM custom_domains WHERE organization_id = @organization_id;

-- name: CustomDomainCreate :one
-- A new claim: pending until verified, for at most pending_seconds; verified at once when the
-- create's own lookup found the record (and no other organization holds the name).
WITH t AS MATERIALIZED (SELECT db_now() AS at)
INSERT INTO custom_domains (organization_id, hostname, uid, status, message, verified_at, next_check_at,
                            checks, checked_at, pending_until, created_at, updated_at)
SELECT @organization_id, @hostname, @uid, @status, @message,
       CASE WHEN @status::custom_domain_status = 'verified' THEN t.at END,
       t.at + make_interval(secs => @next_check_seconds::double precision),
       1, t.at, t.at + make_interval(secs => @pending_seconds::double precision), t.at, t.at
FROM t
ON CONFLICT (organization_id, hostname) DO NOTHING
RETURNING *;

-- name: CustomDomainSetState :one
-- Records a check's outcome on the locked claim.
UPDATE custom_domains
SET status = @status, message = @message, absent_in_a_row = @absent_in_a_row,
    verified_at = CASE WHEN @status::custom_domain_status = 'verified' THEN COALESCE(verified_at, (SELECT db_now()))
                       WHEN @status::custom_domain_status = 'revoked' THEN verified_at END,
    next_check_at = (SELECT db_now()) + make_interval(secs => @next_check_seconds::double precision),
    checks = checks + 1, checked_at = (SELECT db_now()),
    revision = revision + CASE WHEN status <> @status::custom_domain_status THEN 1 ELSE 0 END,
    updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND hostname = @hostname AND uid = @uid
RETURNING *;

-- name: CustomDomainsDue :many
-- The claims due for a check, taken by one checker: their next check moves lease_seconds on, so
-- that another replica's checker does not take them meanwhile (SPEC 3.7: deduplicated across
-- replicas), and a checker that dies lets them come due again.
WITH due AS (
    SELECT organization_id, hostname FROM custom_domains
    WHERE status IN ('pending', 'verified') AND next_check_at <= (SELECT db_now())
    ORDER BY next_check_at
    LIMIT @max_claims
    FOR UPDATE SKIP LOCKED
)
UPDATE custom_domains c SET next_check_at = (SELECT db_now()) + make_interval(secs => @lease_seconds::double precision)
FROM due WHERE c.organization_id = due.organization_id AND c.hostname = due.hostname
RETURNING c.*, (c.pending_until <= (SELECT db_now()))::boolean AS pending_expired;

-- name: CustomDomainInUse :one
-- Whether a reservation of the organization that still holds its origin names the claim.
SELECT EXISTS (
    SELECT 1 FROM worker_endpoint_origin_reservations r
    WHERE r.organization_id = @organization_id AND r.custom_domain = @hostname
      AND reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) <> 'released'
      AND (reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) <> 'expired' OR r.endpoint_uid IS NOT NULL)
)::boolean AS in_use;

-- name: CustomDomainDelete :execrows
DELETE FROM custom_domains WHERE organization_id = @organization_id AND hostname = @hostname AND uid = @uid;

-- name: CustomDomainCovering :one
-- The organization's verified claim a reservation's hostname stands under: the hostname itself,
-- or the wildcard one label above it; and whether another organization verified the exact name
-- (a wildcard never covers it).
SELECT c.hostname,
       EXISTS (SELECT 1 FROM custom_domains o WHERE o.hostname = @hostname AND o.status = 'verified'
               AND o.organization_id <> @organization_id)::boolean AS exact_elsewhere
FROM custom_domains c
WHERE c.organization_id = @organization_id AND c.status = 'verified' AND c.hostname IN (@hostname, @wildcard)
ORDER BY c.hostname = @hostname DESC
LIMIT 1;

-- name: CustomDomainCoveringLocked :one
-- CustomDomainCovering for a mutation: the claim is locked FOR SHARE until the transaction ends, so
-- that a delete of it (FOR UPDATE, then its in-use check) and a reservation created under it
-- serialize: one sees the other.
-- The organization's verified claim a reservation's hostname stands under: the hostname itself,
-- or the wildcard one label above it; and whether another organization verified the exact name
-- (a wildcard never covers it).
SELECT c.hostname,
       EXISTS (SELECT 1 FROM custom_domains o WHERE o.hostname = @hostname AND o.status = 'verified'
               AND o.organization_id <> @organization_id)::boolean AS exact_elsewhere
FROM custom_domains c
WHERE c.organization_id = @organization_id AND c.status = 'verified' AND c.hostname IN (@hostname, @wildcard)
ORDER BY c.hostname = @hostname DESC
LIMIT 1
FOR SHARE OF c;

-- name: CustomDomainRevokedHolds :many
-- What still stands on revoked custom domains (SPEC 3.7: a domain that changes hands is let go):
-- each reservation that holds a name on one, its activation, the endpoint recorded on it while
-- that is not deleted, and the owners' tokens of the three, so that the janitor undoes them in the
-- destroy order on their owners' behalf.
SELECT r.organization_id, o.name AS organization_name, r.id AS reservation_id, r.status AS reservation_status,
       COALESCE(r.hostname, '')::text AS hostname,
       e.space AS endpoint_space, e.name AS endpoint_name,
       COALESCE(ba.token, '')::text AS activation_token, COALESCE(be.token, '')::text AS endpoint_token,
       COALESCE(br.token, '')::text AS reservation_token
FROM custom_domains c
JOIN worker_endpoint_origin_reservations r ON r.organization_id = c.organization_id AND r.custom_domain = c.hostname
JOIN organizations o ON o.id = r.organization_id
LEFT JOIN worker_endpoints e ON e.uid = r.endpoint_uid AND e.status <> 'deleted'
LEFT JOIN ownership_bindings ba ON ba.organization_id = r.organization_id AND ba.kind = 'worker-endpoint-activation' AND ba.external_key = r.id
LEFT JOIN ownership_bindings be ON be.organization_id = r.organization_id AND be.kind = 'worker-endpoint' AND be.external_key = e.space || '/' || e.name
LEFT JOIN ownership_bindings br ON br.organization_id = r.organization_id AND br.kind = 'worker-endpoint-origin-reservation' AND br.external_key = r.id
WHERE c.status = 'revoked' AND r.status <> 'released'
  AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  -- What the janitor cannot undo under an owner's token is left out, so that it never holds back
  -- the others (a row without an owner is the operator's to look at).
  AND br.token IS NOT NULL
  AND (r.status <> 'activated' OR ba.token IS NOT NULL)
  AND (e.uid IS NULL OR be.token IS NOT NULL)
ORDER BY r.updated_at
LIMIT 50;

-- name: ReservationCustomDomainRepoint :execrows
-- Records that another verified claim of the organization now covers a reservation's hostname (its
-- exact name verified after the wildcard it stood under was revoked), so that it is not let go.
UPDATE worker_endpoint_origin_reservations SET custom_domain = @custom_domain
WHERE organization_id = @organization_id AND id = @id AND hostname IS NOT NULL;
