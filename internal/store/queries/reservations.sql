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

-- name: ReservationSweepExpired
-- Lazy expiry (SPEC 3.3): a prepared or bound row whose TTL passed becomes expired. Run before any
-- read of, or conflict with, the rows it matches: the row itself, its worker key and its origin.
UPDATE worker_endpoint_origin_reservations
SET status = 'expired', revision = revision + 1, updated_at = now()
WHERE status IN ('prepared', 'bound') AND expires_at <= now()
  AND ((organization_id = @organization_id AND id = @id)
       OR (organization_id = @organization_id AND space = @space AND worker_name = @worker_name)
       OR canonical_origin = @canonical_origin);

-- name: ReservationBindWorker
-- Binds (or advances the binding of) a live reservation to the exact worker incarnation. The
-- caller has re-proved, in this transaction, that the worker is Ready at its current generation;
-- this CAS refuses a reservation bound to another UID, an older revision than the one held, and
-- any placement other than the reservation's own (SPEC 3.3, bind).
UPDATE worker_endpoint_origin_reservations
SET status = CASE WHEN status = 'prepared' THEN 'bound' ELSE status END,
    bound_worker_uid = @worker_uid, bound_worker_revision = @worker_revision,
    revision = revision + 1, updated_at = now()
WHERE organization_id = @organization_id AND id = @id
  AND status IN ('prepared', 'bound', 'activated')
  AND space = @space AND worker_name = @worker_name
  AND (bound_worker_uid IS NULL OR (bound_worker_uid = @worker_uid AND bound_worker_revision < @worker_revision))
  AND offering_id = @offering_id AND offering_digest = @offering_digest AND pack = @pack AND installation = @installation
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationActivate
-- bound -> activated with the exact endpoint, which the caller has proved Ready, related to the
-- bound worker, at the reservation's origin and placement (SPEC 3.3, activation).
UPDATE worker_endpoint_origin_reservations
SET status = 'activated', endpoint_uid = @endpoint_uid, endpoint_revision = @endpoint_revision,
    revision = revision + 1, updated_at = now()
WHERE organization_id = @organization_id AND id = @id AND status = 'bound'
  AND bound_worker_uid = @worker_uid AND canonical_origin = @canonical_origin
  AND pack = @pack AND installation = @installation
  AND (endpoint_uid IS NULL OR endpoint_uid = @endpoint_uid)
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationDeactivate
-- activated -> bound, keeping the endpoint UID and revision as the deletion witness.
UPDATE worker_endpoint_origin_reservations
SET status = 'bound', revision = revision + 1, updated_at = now()
WHERE organization_id = @organization_id AND id = @id AND status = 'activated'
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationReleaseFenced
-- Release under the four fences of SPEC 3.3 (reservation_fences, migration 3), checked and
-- applied in this one statement on the locked row. It returns the fences whether or not the
-- release happened.
WITH target AS (
    SELECT r.organization_id, r.id, r.status, r.endpoint_uid
    FROM worker_endpoint_origin_reservations r
    WHERE r.organization_id = @organization_id AND r.id = @id AND r.uid = @uid
    FOR UPDATE
), fences AS (
    SELECT t.organization_id, t.id, t.status, f.*
    FROM target t, LATERAL reservation_fences(t.organization_id, t.id, t.status, t.endpoint_uid) f
), released AS (
    UPDATE worker_endpoint_origin_reservations r
    SET status = 'released', revision = r.revision + 1, released_at = now(), updated_at = now()
    FROM fences f
    WHERE r.organization_id = f.organization_id AND r.id = f.id
      AND f.status IN ('prepared', 'bound', 'expired')
      AND NOT (f.activation OR f.lease_claimed OR f.endpoint_present OR f.attestation_open OR f.deployment_live)
    RETURNING r.id
)
SELECT f.status, f.activation, f.lease_claimed, f.endpoint_present, f.attestation_open, f.deployment_live,
       EXISTS (SELECT 1 FROM released) AS released
FROM fences f;

-- name: ReservationClearWitness
-- Lets go, in place, of an endpoint witness that is provably gone (the release fences but
-- activation): the row stays bound (an activated row becomes bound), or stays expired. A
-- Host-minted id is never released to be re-minted, so this is how it forgets an old endpoint.
WITH target AS (
    SELECT r.organization_id, r.id, r.status, r.endpoint_uid
    FROM worker_endpoint_origin_reservations r
    WHERE r.organization_id = @organization_id AND r.id = @id AND r.endpoint_uid IS NOT NULL
      AND r.status IN ('bound', 'activated', 'expired')
    FOR UPDATE
), fences AS (
    SELECT t.organization_id, t.id, f.*
    FROM target t, LATERAL reservation_fences(t.organization_id, t.id, t.status, t.endpoint_uid) f
), cleared AS (
    UPDATE worker_endpoint_origin_reservations r
    SET endpoint_uid = NULL, endpoint_revision = NULL,
        status = CASE WHEN r.status = 'activated' THEN 'bound' ELSE r.status END,
        revision = r.revision + 1, updated_at = now()
    FROM fences f
    WHERE r.organization_id = f.organization_id AND r.id = f.id
      AND NOT (f.lease_claimed OR f.endpoint_present OR f.attestation_open OR f.deployment_live)
    RETURNING r.id
)
SELECT f.lease_claimed, f.endpoint_present, f.attestation_open, f.deployment_live, EXISTS (SELECT 1 FROM cleared) AS cleared
FROM fences f;

-- name: ReservationHostMintedSiblings
-- Other Host-minted rows for the same worker name: earlier incarnations that may still hold the
-- address.
SELECT id, uid
FROM worker_endpoint_origin_reservations
WHERE organization_id = @organization_id AND space = @space AND worker_name = @worker_name
  AND host_minted AND id <> @id
  AND (status IN ('prepared', 'bound', 'activated') OR (status = 'expired' AND endpoint_uid IS NOT NULL))
ORDER BY created_at, id;

-- name: ReservationMint
-- A fresh Host-minted row, bound to the worker that it is derived from. A released row of the
-- same id is replaced (new UID). The partial unique indexes refuse the mint when a caller's live
-- reservation holds the address or the worker: it is never taken.
INSERT INTO worker_endpoint_origin_reservations AS r (
    organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
    status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
    offering_id, offering_digest, pack, installation)
VALUES (@organization_id, @id, @uid, 'takoserver.worker-endpoint-origin-reservation.v2', @space, @worker_name,
        @subdomain, @canonical_origin, @ttl_seconds::integer, 'bound', now() + make_interval(secs => @ttl_seconds::integer),
        true, @worker_uid, @worker_revision, @offering_id, @offering_digest, @pack, @installation)
ON CONFLICT (organization_id, id) DO UPDATE
SET uid = excluded.uid, status = 'bound', revision = r.revision + 1, expires_at = excluded.expires_at,
    bound_worker_uid = excluded.bound_worker_uid, bound_worker_revision = excluded.bound_worker_revision,
    endpoint_uid = NULL, endpoint_revision = NULL, subdomain = excluded.subdomain,
    canonical_origin = excluded.canonical_origin, offering_id = excluded.offering_id,
    offering_digest = excluded.offering_digest, pack = excluded.pack, installation = excluded.installation,
    created_at = now(), updated_at = now(), released_at = NULL
WHERE r.status = 'released'
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationRevive
-- Revival (SPEC 3.4): an expired Host-minted row that never published (no witness at all), whose
-- bound worker, if any, is this exact incarnation, goes back to the state the sweep took it from on
-- a fresh TTL. The unique indexes refuse it if it would displace a live holder.
UPDATE worker_endpoint_origin_reservations
SET status = CASE WHEN bound_worker_uid IS NULL THEN 'prepared' ELSE 'bound' END,
    expires_at = now() + make_interval(secs => ttl_seconds), revision = revision + 1, updated_at = now()
WHERE organization_id = @organization_id AND id = @id AND host_minted
  AND status = 'expired' AND endpoint_uid IS NULL
  AND (bound_worker_uid IS NULL OR bound_worker_uid = @worker_uid)
RETURNING organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
          revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
          endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation;

-- name: ReservationGetAny
-- Any row of the id, released included, for the mint's decisions.
SELECT organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
       revision, status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
       endpoint_uid, endpoint_revision, offering_id, offering_digest, pack, installation
FROM worker_endpoint_origin_reservations
WHERE organization_id = @organization_id AND id = @id
FOR UPDATE;
