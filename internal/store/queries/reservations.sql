-- name: ReservationGetByID
SELECT organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
       revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
       endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation
FROM worker_endpoint_origin_reservations
WHERE organization_id = @organization_id AND id = @id;

-- name: ReservationCreate
-- A released row of the same id is replaced by the new incarnation (new UID); any other existing
-- row makes this return no row. The partial unique indexes refuse a second live holder of the
-- worker key or the origin.
INSERT INTO worker_endpoint_origin_reservations AS r (
    organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
    status, expires_at, host_minted, offering_id, offering_digest, pack, installation)
VALUES (@organization_id, @id, @uid, 'takoserver.worker-endpoint-origin-reservation.v2', @space, @worker_name,
        @subdomain, @canonical_origin, @ttl_seconds::integer, 'prepared', now() + make_interval(secs => @ttl_seconds::integer),
        false, @offering_id, @offering_digest, @pack, @installation)
ON CONFLICT (organization_id, id) DO UPDATE
SET uid = excluded.uid,
    format = excluded.format,
    space = excluded.space,
    worker_name = excluded.worker_name,
    subdomain = excluded.subdomain,
    canonical_origin = excluded.canonical_origin,
    ttl_seconds = excluded.ttl_seconds,
    revision = r.revision + 1,
    status = 'prepared',
    expires_at = excluded.expires_at,
    host_minted = false,
    bound_worker_uid = NULL,
    bound_worker_revision = NULL,
    endpoint_uid = NULL,
    endpoint_revision = NULL,
    offering_id = excluded.offering_id,
    offering_digest = excluded.offering_digest,
    pack = excluded.pack,
    installation = excluded.installation,
    created_at = now(),
    updated_at = now(),
    released_at = NULL
WHERE r.status = 'released'
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationRelease
-- Release of a prepared or expired row with nothing retained. The full four-fence release of SPEC
-- 3.3 replaces this once workers and endpoints exist.
UPDATE worker_endpoint_origin_reservations
SET status = 'released', revision = revision + 1, released_at = now(), updated_at = now()
WHERE organization_id = @organization_id AND id = @id AND uid = @uid
  AND status IN ('prepared', 'expired') AND endpoint_uid IS NULL
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationSweepExpired
-- Lazy expiry (SPEC 3.3): a prepared or bound row whose TTL passed becomes expired. Run before any
-- read of, or conflict with, the rows it matches: the row itself, its worker key and its origin.
UPDATE worker_endpoint_origin_reservations
SET status = 'expired', revision = revision + 1, updated_at = now()
WHERE status IN ('prepared', 'bound') AND expires_at <= now()
  AND ((organization_id = @organization_id AND id = @id)
       OR (organization_id = @organization_id AND space = @space AND worker_name = @worker_name)
       OR canonical_origin = @canonical_origin);
