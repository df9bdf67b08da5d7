-- name: ReservationRead :one
-- One reservation with its status as of database time, and the owning token of its ownership key
-- (so that a GET is one round trip). Reads take no lock and write nothing.
SELECT sqlc.embed(r), reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) AS effective_status,
       COALESCE((SELECT b.token FROM ownership_bindings b
                 WHERE b.organization_id = r.organization_id AND b.kind = @ownership_kind AND b.external_key = r.id), '')::text AS ownership_token
FROM worker_endpoint_origin_reservations r
WHERE r.organization_id = @organization_id AND r.id = @id;

-- name: ReservationLock :one
-- The row a mutation decides on, locked for the rest of its transaction, with its status as of
-- database time.
SELECT sqlc.embed(r), reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) AS effective_status
FROM worker_endpoint_origin_reservations r
WHERE r.organization_id = @organization_id AND r.id = @id
FOR UPDATE;

-- name: ReservationOriginAvailable :one
-- Whether an origin is free for the caller (SPEC 3.1, available): no reservation of any
-- organization other than the caller's own named one holds it, and no endpoint other than the
-- one that reservation witnesses may stand on it. Rows of the caller's organization that a mint
-- would supersede (Host-minted rows, and their endpoints, of the same worker name) do not count.
-- Reads only; it says nothing about whose.
SELECT (NOT EXISTS (
            SELECT 1 FROM worker_endpoint_origin_reservations r
            WHERE r.canonical_origin = @canonical_origin
              -- What the origin's partial unique index holds (implied by the next line), so that
              -- the index finds the row whatever the statistics say.
              AND (r.status IN ('prepared', 'bound', 'activated') OR (r.status = 'expired' AND r.endpoint_uid IS NOT NULL))
              AND (reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) IN ('prepared', 'bound', 'activated')
                   OR (r.status IN ('bound', 'expired') AND r.endpoint_uid IS NOT NULL))
              AND NOT (r.organization_id = @organization_id AND r.id = @reservation_id)
              AND NOT (r.organization_id = @organization_id AND r.host_minted AND r.space = @space AND r.worker_name = @worker_name))
        AND NOT EXISTS (
            SELECT 1 FROM worker_endpoints e
            WHERE e.canonical_origin = @canonical_origin AND e.status <> 'deleted'
              AND NOT EXISTS (SELECT 1 FROM worker_endpoint_origin_reservations r
                              WHERE r.organization_id = @organization_id AND r.id = @reservation_id AND r.endpoint_uid = e.uid)
              AND NOT (e.organization_id = @organization_id AND e.host_minted AND e.space = @space AND e.worker_name = @worker_name)))::boolean AS available;

-- name: ReservationOriginHoldingReservation :one
-- Who holds an origin that is not available (the rows ReservationOriginAvailable finds), for a
-- caller that may know its own organization's rows by name and nothing of another's.
SELECT r.organization_id, r.id
FROM worker_endpoint_origin_reservations r
WHERE r.canonical_origin = @canonical_origin
  AND (r.status IN ('prepared', 'bound', 'activated') OR (r.status = 'expired' AND r.endpoint_uid IS NOT NULL))
  AND (reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) IN ('prepared', 'bound', 'activated')
       OR (r.status IN ('bound', 'expired') AND r.endpoint_uid IS NOT NULL))
  AND NOT (r.organization_id = @organization_id AND r.id = @reservation_id)
  AND NOT (r.organization_id = @organization_id AND r.host_minted AND r.space = @space AND r.worker_name = @worker_name)
ORDER BY r.id
LIMIT 1;

-- name: ReservationOriginHoldingEndpoint :one
SELECT e.organization_id, e.space, e.name
FROM worker_endpoints e
WHERE e.canonical_origin = @canonical_origin AND e.status <> 'deleted'
  AND NOT EXISTS (SELECT 1 FROM worker_endpoint_origin_reservations x
                  WHERE x.organization_id = @organization_id AND x.id = @reservation_id AND x.endpoint_uid = e.uid)
  AND NOT (e.organization_id = @organization_id AND e.host_minted AND e.space = @space AND e.worker_name = @worker_name)
ORDER BY e.space, e.name
LIMIT 1;

-- name: ReservationsExpireLapsed :execrows
-- The janitor's lazy expiry of reservations nothing touched again (ReservationSweep's rule, SPEC
-- 3.3): a prepared or bound row whose TTL passed and that has not published is stored expired, so
-- that it stops counting toward its organization's ceiling in the quota counters too (migration
-- 18). At most batch rows a statement (the caller repeats it); rows another transaction holds are
-- left for the next pass.
UPDATE worker_endpoint_origin_reservations r
SET status = 'expired', revision = r.revision + 1, updated_at = (SELECT db_now())
FROM (SELECT x.organization_id, x.id FROM worker_endpoint_origin_reservations x
      WHERE x.status IN ('prepared', 'bound') AND x.expires_at <= (SELECT db_now())
        AND x.format = 'takoserver.worker-endpoint-origin-reservation.v2'
        AND NOT reservation_published(x.status, x.endpoint_uid)
      ORDER BY x.expires_at
      LIMIT @batch::integer
      FOR UPDATE SKIP LOCKED) lapsed
WHERE r.organization_id = lapsed.organization_id AND r.id = lapsed.id;

-- name: ReservationSweep :execrows
-- Lazy expiry (SPEC 3.3): a prepared or bound row whose TTL passed and that has not published
-- becomes expired. Run before any write that could conflict with the rows it matches: the row
-- itself, its worker key and its origin. Each of the three is found through its own index (a
-- single OR lets the planner scan a whole organization).
UPDATE worker_endpoint_origin_reservations r
SET status = 'expired', revision = r.revision + 1, updated_at = (SELECT db_now())
FROM (
    SELECT x.organization_id, x.id FROM worker_endpoint_origin_reservations x
    WHERE x.organization_id = @organization_id AND x.id = @id
    UNION
    SELECT x.organization_id, x.id FROM worker_endpoint_origin_reservations x
    WHERE x.organization_id = @organization_id AND x.space = @space AND x.worker_name = @worker_name
      AND (x.status IN ('prepared', 'bound', 'activated') OR (x.status = 'expired' AND x.endpoint_uid IS NOT NULL))
    UNION
    SELECT x.organization_id, x.id FROM worker_endpoint_origin_reservations x
    WHERE x.canonical_origin = @canonical_origin
      AND (x.status IN ('prepared', 'bound', 'activated') OR (x.status = 'expired' AND x.endpoint_uid IS NOT NULL))
) c
WHERE r.organization_id = c.organization_id AND r.id = c.id
  AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND r.status IN ('prepared', 'bound') AND r.expires_at <= (SELECT db_now())
  AND NOT reservation_published(r.status, r.endpoint_uid);

-- name: ReservationCreate :one
-- A new incarnation (new UID) in state prepared. A released row of the same id, or an expired one
-- holding no witness, is replaced; any other existing row makes this return no row. The partial
-- unique indexes refuse a second holder of the worker key or the origin.
WITH t AS MATERIALIZED (SELECT db_now() AS at) -- the time, read once (not folded into each use)
INSERT INTO worker_endpoint_origin_reservations AS r (
    organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
    status, expires_at, host_minted, offering_id, offering_digest, pack, installation, created_at, updated_at,
    hostname, custom_domain)
SELECT @organization_id, @id, @uid, 'takoserver.worker-endpoint-origin-reservation.v2', @space, @worker_name,
       @subdomain, @canonical_origin, @ttl_seconds::integer, 'prepared', t.at + make_interval(secs => @ttl_seconds::integer),
       false, @offering_id, @offering_digest, @pack, @installation, t.at, t.at,
       sqlc.narg(hostname)::text, sqlc.narg(custom_domain)::text
FROM t
ON CONFLICT (organization_id, id) DO UPDATE
SET uid = excluded.uid, format = excluded.format, space = excluded.space, worker_name = excluded.worker_name,
    subdomain = excluded.subdomain, canonical_origin = excluded.canonical_origin, ttl_seconds = excluded.ttl_seconds,
    hostname = excluded.hostname, custom_domain = excluded.custom_domain,
    revision = r.revision + 1, status = 'prepared', expires_at = excluded.expires_at, host_minted = false,
    bound_worker_uid = NULL, bound_worker_revision = NULL, endpoint_uid = NULL, endpoint_revision = NULL,
    offering_id = excluded.offering_id, offering_digest = excluded.offering_digest, pack = excluded.pack,
    installation = excluded.installation, created_at = excluded.created_at, updated_at = excluded.updated_at, released_at = NULL
WHERE r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND (r.status = 'released' OR (r.status = 'expired' AND r.endpoint_uid IS NULL))
RETURNING *;

-- name: ReservationBind :one
-- Binds the reservation to the exact worker incarnation, and, for an endpoint create, records the
-- endpoint as its witness, in one compare-and-swap (SPEC 3.3). The caller has proved the worker
-- Ready in this transaction and locked the row (ReservationLock). It writes only when:
--   the row is v2, live (prepared, bound or activated) and for this space/worker and placement;
--   its bound worker is none, this UID (a binding at an older revision advances), or a worker that
--   is provably gone (worker_fences), whose binding this worker takes over;
--   for an endpoint: its witness is none, this endpoint, or one that is provably gone (the fences
--   of the in-place clear), which is cleared in place as this one is recorded.
-- The fences come back whether or not it wrote, so that a refusal can name them.
WITH cur AS (
    SELECT r.bound_worker_uid, r.endpoint_uid,
           wf.worker_present, wf.attestation_open AS worker_attestation_open, wf.deployment_live AS worker_deployment_live,
           wf.lease_claimed AS worker_lease_claimed,
           ef.lease_claimed AS witness_lease_claimed, ef.endpoint_present AS witness_present,
           ef.attestation_open AS witness_attestation_open, ef.deployment_live AS witness_deployment_live
    FROM worker_endpoint_origin_reservations r,
         LATERAL worker_fences(r.organization_id, r.id, r.bound_worker_uid, (SELECT db_now())) wf,
         LATERAL reservation_fences(r.organization_id, r.id, r.status, r.endpoint_uid, (SELECT db_now())) ef
    WHERE r.organization_id = @organization_id AND r.id = @id
), gate AS (
    SELECT (cur.bound_worker_uid IS NULL OR cur.bound_worker_uid = @worker_uid::uuid
            OR NOT (cur.worker_present OR cur.worker_attestation_open OR cur.worker_deployment_live OR cur.worker_lease_claimed)) AS worker_free,
           (cur.endpoint_uid IS NULL OR cur.endpoint_uid IS NOT DISTINCT FROM sqlc.narg('endpoint_uid')::uuid
            OR NOT (cur.witness_lease_claimed OR cur.witness_present OR cur.witness_attestation_open OR cur.witness_deployment_live)) AS witness_free,
           (cur.bound_worker_uid IS NULL OR cur.bound_worker_uid = @worker_uid::uuid) AS same_worker
    FROM cur
), upd AS (
    UPDATE worker_endpoint_origin_reservations r
    SET status = CASE
            WHEN r.status = 'prepared' OR NOT gate.same_worker THEN 'bound'
            WHEN sqlc.narg('endpoint_uid')::uuid IS NOT NULL AND r.endpoint_uid IS DISTINCT FROM sqlc.narg('endpoint_uid')::uuid THEN 'bound'
            ELSE r.status END,
        bound_worker_uid = @worker_uid,
        bound_worker_revision = CASE
            WHEN gate.same_worker AND r.bound_worker_revision IS NOT NULL THEN greatest(r.bound_worker_revision, @worker_revision::bigint)
            ELSE @worker_revision::bigint END,
        endpoint_uid = CASE
            WHEN sqlc.narg('endpoint_uid')::uuid IS NOT NULL THEN sqlc.narg('endpoint_uid')::uuid
            WHEN gate.same_worker THEN r.endpoint_uid END,
        endpoint_revision = CASE
            WHEN sqlc.narg('endpoint_uid')::uuid IS NOT NULL THEN sqlc.narg('endpoint_revision')::bigint
            WHEN gate.same_worker THEN r.endpoint_revision END,
        revision = r.revision + 1, updated_at = (SELECT db_now())
    FROM gate
    WHERE r.organization_id = @organization_id AND r.id = @id
      AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
      AND reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) IN ('prepared', 'bound', 'activated')
      AND r.space = @space AND r.worker_name = @worker_name
      AND r.offering_id = @offering_id AND r.offering_digest = @offering_digest AND r.pack = @pack AND r.installation = @installation
      AND gate.worker_free
      -- The witness must be free whenever it changes: a new endpoint, or a new worker (whose
      -- binding drops the old worker's witness).
      AND (gate.witness_free OR (sqlc.narg('endpoint_uid')::uuid IS NULL AND gate.same_worker))
    RETURNING r.revision
)
SELECT coalesce((SELECT revision FROM upd), 0)::bigint AS written_revision,
       cur.worker_present, cur.worker_attestation_open, cur.worker_deployment_live, cur.worker_lease_claimed,
       cur.witness_lease_claimed, cur.witness_present, cur.witness_attestation_open, cur.witness_deployment_live
FROM cur;

-- name: ReservationActivate :one
-- bound -> activated with the exact endpoint recorded as its witness, which the caller has proved
-- Ready, related to the bound worker, at the reservation's origin and placement (SPEC 3.3).
UPDATE worker_endpoint_origin_reservations
SET status = 'activated', endpoint_revision = @endpoint_revision, revision = revision + 1, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND id = @id
  AND format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND reservation_effective_status(status, expires_at, endpoint_uid, (SELECT db_now())) = 'bound'
  AND endpoint_uid = @endpoint_uid AND bound_worker_uid = @worker_uid AND canonical_origin = @canonical_origin
  AND pack = @pack AND installation = @installation
RETURNING *;

-- name: ReservationDeactivate :one
-- activated -> bound, keeping the endpoint as the deletion witness.
UPDATE worker_endpoint_origin_reservations
SET status = 'bound', revision = revision + 1, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND id = @id
  AND format = 'takoserver.worker-endpoint-origin-reservation.v2' AND status = 'activated'
RETURNING *;

-- name: ReservationRelease :one
-- Release under the four fences of SPEC 3.3 (reservation_fences), checked and applied in this one
-- statement on the row the caller locked. It returns the fences whether or not the release
-- happened.
WITH cur AS (
    SELECT r.organization_id, r.id, r.status, r.endpoint_uid,
           reservation_effective_status(r.status, r.expires_at, r.endpoint_uid, (SELECT db_now())) AS effective
    FROM worker_endpoint_origin_reservations r
    WHERE r.organization_id = @organization_id AND r.id = @id AND r.uid = @uid
      AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
), fences AS (
    SELECT cur.organization_id, cur.id, cur.effective, f.*
    FROM cur, LATERAL reservation_fences(cur.organization_id, cur.id, cur.status, cur.endpoint_uid, (SELECT db_now())) f
), released AS (
    UPDATE worker_endpoint_origin_reservations r
    SET status = 'released', revision = r.revision + 1, released_at = (SELECT db_now()), updated_at = (SELECT db_now())
    FROM fences f
    WHERE r.organization_id = f.organization_id AND r.id = f.id
      AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
      AND f.effective IN ('prepared', 'bound', 'expired')
      AND NOT (f.activation OR f.lease_claimed OR f.endpoint_present OR f.attestation_open OR f.deployment_live)
    RETURNING r.id
)
SELECT f.effective::reservation_status AS status, f.activation, f.lease_claimed, f.endpoint_present, f.attestation_open, f.deployment_live,
       EXISTS (SELECT 1 FROM released) AS released
FROM fences f;

-- name: ReservationClearWitness :one
-- Lets go, in place, of an endpoint witness that is provably gone (the release fences but
-- activation): the row stays bound (an activated row becomes bound), or stays expired. It returns
-- the fences whether or not it cleared.
WITH cur AS (
    SELECT r.organization_id, r.id, r.status, r.endpoint_uid
    FROM worker_endpoint_origin_reservations r
    WHERE r.organization_id = @organization_id AND r.id = @id AND r.endpoint_uid IS NOT NULL
      AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
      AND r.status IN ('bound', 'activated', 'expired')
), fences AS (
    SELECT cur.organization_id, cur.id, f.*
    FROM cur, LATERAL reservation_fences(cur.organization_id, cur.id, cur.status, cur.endpoint_uid, (SELECT db_now())) f
), cleared AS (
    UPDATE worker_endpoint_origin_reservations r
    SET endpoint_uid = NULL, endpoint_revision = NULL,
        status = CASE WHEN r.status = 'activated' THEN 'bound' ELSE r.status END,
        revision = r.revision + 1, updated_at = (SELECT db_now())
    FROM fences f
    WHERE r.organization_id = f.organization_id AND r.id = f.id
      AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
      AND NOT (f.lease_claimed OR f.endpoint_present OR f.attestation_open OR f.deployment_live)
    RETURNING r.id
)
SELECT f.lease_claimed, f.endpoint_present, f.attestation_open, f.deployment_live, EXISTS (SELECT 1 FROM cleared) AS cleared
FROM fences f;

-- name: ReservationHostMintedSiblings :many
-- Other Host-minted rows for the same worker name that still hold the address: earlier
-- incarnations, released under the fences before a mint.
SELECT id, uid
FROM worker_endpoint_origin_reservations
WHERE organization_id = @organization_id AND space = @space AND worker_name = @worker_name
  AND host_minted AND id <> @id
  AND (status IN ('prepared', 'bound', 'activated') OR (status = 'expired' AND endpoint_uid IS NOT NULL))
ORDER BY created_at, id
FOR UPDATE;

-- name: ReservationMint :one
-- A fresh Host-minted row, bound to the worker it is derived from. A released row of the same id
-- is replaced (new UID). The partial unique indexes refuse the mint when a caller's reservation
-- holds the address or the worker: it is never taken.
INSERT INTO worker_endpoint_origin_reservations AS r (
    organization_id, id, uid, format, space, worker_name, subdomain, canonical_origin, ttl_seconds,
    status, expires_at, host_minted, bound_worker_uid, bound_worker_revision,
    offering_id, offering_digest, pack, installation, created_at, updated_at)
VALUES (@organization_id, @id, @uid, 'takoserver.worker-endpoint-origin-reservation.v2', @space, @worker_name,
        @subdomain, @canonical_origin, @ttl_seconds::integer, 'bound', (SELECT db_now()) + make_interval(secs => @ttl_seconds::integer),
        true, @worker_uid, @worker_revision, @offering_id, @offering_digest, @pack, @installation, (SELECT db_now()), (SELECT db_now()))
ON CONFLICT (organization_id, id) DO UPDATE
SET uid = excluded.uid, status = 'bound', revision = r.revision + 1, expires_at = excluded.expires_at,
    bound_worker_uid = excluded.bound_worker_uid, bound_worker_revision = excluded.bound_worker_revision,
    endpoint_uid = NULL, endpoint_revision = NULL, subdomain = excluded.subdomain,
    canonical_origin = excluded.canonical_origin, offering_id = excluded.offering_id,
    offering_digest = excluded.offering_digest, pack = excluded.pack, installation = excluded.installation,
    created_at = excluded.created_at, updated_at = excluded.updated_at, released_at = NULL
WHERE r.status = 'released' AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
RETURNING *;

-- name: ReservationRevive :one
-- Revival (SPEC 3.4): an expired Host-minted row that never published (no witness at all), whose
-- bound worker, if any, is this exact incarnation, goes back to the state the sweep took it from on
-- a fresh TTL. The unique indexes refuse it if it would displace a live holder.
UPDATE worker_endpoint_origin_reservations
SET status = (CASE WHEN bound_worker_uid IS NULL THEN 'prepared' ELSE 'bound' END)::reservation_status,
    expires_at = (SELECT db_now()) + make_interval(secs => ttl_seconds), revision = revision + 1, updated_at = (SELECT db_now())
WHERE organization_id = @organization_id AND id = @id AND host_minted
  AND format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND status = 'expired' AND endpoint_uid IS NULL
  AND (bound_worker_uid IS NULL OR bound_worker_uid = @worker_uid)
RETURNING *;


-- name: ReservationsOfGoneWorkers :many
-- Host-minted rows whose bound worker is deleted and whose deletion attestation closed: that UID
-- can never mint again, so the janitor releases them under the four fences (SPEC 3.4).
SELECT r.organization_id, r.id, r.uid
FROM worker_endpoint_origin_reservations r
JOIN workers w ON w.uid = r.bound_worker_uid
WHERE r.host_minted AND r.status IN ('prepared', 'bound', 'expired')
  AND r.format = 'takoserver.worker-endpoint-origin-reservation.v2'
  AND w.status = 'deleted'
  AND NOT EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = w.uid AND a.status = 'open')
ORDER BY r.updated_at
LIMIT 100;

-- name: ReservationMintedOfWorker :many
-- The Host-minted rows bound to one worker, for the tail of that worker's delete.
SELECT id, uid FROM worker_endpoint_origin_reservations
WHERE organization_id = @organization_id AND bound_worker_uid = @worker_uid AND host_minted
  AND status IN ('prepared', 'bound', 'expired')
  AND format = 'takoserver.worker-endpoint-origin-reservation.v2';
