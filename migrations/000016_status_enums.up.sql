-- One name for an endpoint's kind (issue 15): the ledger and the operations say worker-endpoint,
-- and now so do the deployments and the deletion attestations, and the API that answers them.
ALTER TABLE deployments DROP CONSTRAINT deployments_resource_kind_check;
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_resource_kind_check;
UPDATE deployments SET resource_kind = 'worker-endpoint' WHERE resource_kind = 'endpoint';
UPDATE deletion_attestations SET resource_kind = 'worker-endpoint' WHERE resource_kind = 'endpoint';
ALTER TABLE deployments
    ADD CONSTRAINT deployments_resource_kind_check CHECK (resource_kind IN ('worker', 'worker-endpoint'));
ALTER TABLE deletion_attestations
    ADD CONSTRAINT deletion_attestations_resource_kind_check CHECK (resource_kind IN ('worker', 'worker-endpoint'));

-- Closed sets of statuses and kinds as PostgreSQL enums (issue 15), so that sqlc types them in Go
-- (dbsqlc.ResourceStatus and its constants) and a value outside the set fails where it is written.
-- ALTER COLUMN TYPE re-parses the views, partial indexes and CHECKs that name a column, and their
-- text literals no longer compare with an enum: they are dropped and made again on the enum, under
-- the same names and with the same predicates. The functions that take a status take the enum
-- (an enum does not cast to text implicitly); their bodies are those of their latest migration.
DROP VIEW worker_states;
DROP VIEW endpoint_states;
DROP FUNCTION resource_present(text, text);
DROP FUNCTION reservation_published(text, uuid);
DROP FUNCTION reservation_effective_status(text, timestamptz, uuid, timestamptz);
DROP FUNCTION reservation_fences(text, text, text, uuid, timestamptz);
DROP FUNCTION attestation_open(text, timestamptz, timestamptz);

DROP INDEX worker_endpoint_origin_reservations_worker_key;
DROP INDEX worker_endpoint_origin_reservations_origin_key;
DROP INDEX operations_running_idx;
DROP INDEX workers_live_key;
DROP INDEX worker_endpoints_live_key;
DROP INDEX worker_endpoints_worker_idx;
DROP INDEX runtime_input_preparations_reservation_idx;
DROP INDEX runtime_input_preparations_worker_idx;
DROP INDEX runtime_input_preparations_claim_op_idx;
DROP INDEX worker_endpoints_origin_key;
DROP INDEX sealing_keys_one_current;
DROP INDEX workers_script_key;
DROP INDEX worker_endpoint_origin_reservations_live_idx;
DROP INDEX runtime_input_preparations_pending_idx;
DROP INDEX workers_creating_operation_idx;
DROP INDEX worker_endpoints_creating_operation_idx;
DROP INDEX workers_deleted_script_idx;
DROP INDEX worker_endpoint_origin_reservations_minted_worker_idx;
DROP INDEX workers_installation_live_idx;
DROP INDEX deletion_attestations_closing_idx;
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_action_check;
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_status_check;
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_check;
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_resource_kind_check;
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_status_check;
ALTER TABLE deployments DROP CONSTRAINT deployments_resource_kind_check;
ALTER TABLE deployments DROP CONSTRAINT deployments_status_check;
ALTER TABLE operations DROP CONSTRAINT operations_check;
ALTER TABLE operations DROP CONSTRAINT operations_status_check;
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_check;
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_check2;
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_status_check;
ALTER TABLE sealing_keys DROP CONSTRAINT sealing_keys_check;
ALTER TABLE sealing_keys DROP CONSTRAINT sealing_keys_status_check;
ALTER TABLE worker_endpoint_origin_reservations DROP CONSTRAINT worker_endpoint_origin_reservations_check2;
ALTER TABLE worker_endpoint_origin_reservations DROP CONSTRAINT worker_endpoint_origin_reservations_check3;
ALTER TABLE worker_endpoint_origin_reservations DROP CONSTRAINT worker_endpoint_origin_reservations_status_check;
ALTER TABLE worker_endpoints DROP CONSTRAINT worker_endpoints_status_check;
ALTER TABLE workers DROP CONSTRAINT workers_status_check;

CREATE TYPE operation_status AS ENUM ('running', 'committed', 'refused');
CREATE TYPE resource_status AS ENUM ('creating', 'live', 'deleting', 'deleted');
CREATE TYPE reservation_status AS ENUM ('prepared', 'bound', 'activated', 'expired', 'released');
CREATE TYPE deployment_status AS ENUM ('pending', 'active', 'deleting', 'deleted', 'failed');
CREATE TYPE resource_kind AS ENUM ('worker', 'worker-endpoint');
CREATE TYPE effect_action AS ENUM ('apply', 'delete');
CREATE TYPE effect_status AS ENUM ('planned', 'dispatched', 'succeeded', 'failed', 'unobservable');
CREATE TYPE attestation_status AS ENUM ('open', 'closed');
CREATE TYPE runtime_input_status AS ENUM ('prepared', 'claimed', 'dispatched', 'settled', 'aborted', 'expired', 'failed');
CREATE TYPE sealing_key_status AS ENUM ('current', 'previous', 'retired');

ALTER TABLE operations ALTER COLUMN status TYPE operation_status USING status::operation_status;
ALTER TABLE workers ALTER COLUMN status TYPE resource_status USING status::resource_status;
ALTER TABLE worker_endpoints ALTER COLUMN status TYPE resource_status USING status::resource_status;
ALTER TABLE worker_endpoint_origin_reservations ALTER COLUMN status TYPE reservation_status USING status::reservation_status;
ALTER TABLE deployments ALTER COLUMN status TYPE deployment_status USING status::deployment_status;
ALTER TABLE deployments ALTER COLUMN resource_kind TYPE resource_kind USING resource_kind::resource_kind;
ALTER TABLE deletion_attestations ALTER COLUMN resource_kind TYPE resource_kind USING resource_kind::resource_kind;
ALTER TABLE backend_effects ALTER COLUMN action TYPE effect_action USING action::effect_action;
ALTER TABLE backend_effects ALTER COLUMN status TYPE effect_status USING status::effect_status;
ALTER TABLE deletion_attestations ALTER COLUMN status TYPE attestation_status USING status::attestation_status;
ALTER TABLE runtime_input_preparations ALTER COLUMN status TYPE runtime_input_status USING status::runtime_input_status;
ALTER TABLE sealing_keys ALTER COLUMN status TYPE sealing_key_status USING status::sealing_key_status;

ALTER TABLE deletion_attestations ADD CONSTRAINT deletion_attestations_check CHECK (((status = 'closed') = (closed_at IS NOT NULL)));
ALTER TABLE operations ADD CONSTRAINT operations_check CHECK (((status = 'running') = (finished_at IS NULL)));
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_check CHECK (((status IN ('prepared', 'claimed')) = (ciphertext IS NOT NULL)));
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_check2 CHECK (((status IN ('prepared', 'aborted', 'expired')) OR (worker_uid IS NOT NULL) OR (status = 'failed')));
ALTER TABLE sealing_keys ADD CONSTRAINT sealing_keys_check CHECK (((status = 'retired') = (wrapped_key IS NULL)));
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_check2 CHECK (((status NOT IN ('bound', 'activated')) OR (bound_worker_uid IS NOT NULL)));
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_check3 CHECK (((status <> 'activated') OR (endpoint_uid IS NOT NULL)));

CREATE UNIQUE INDEX worker_endpoint_origin_reservations_worker_key ON worker_endpoint_origin_reservations (organization_id, space, worker_name) WHERE ((status IN ('prepared', 'bound', 'activated')) OR ((status = 'expired') AND (endpoint_uid IS NOT NULL)));
CREATE UNIQUE INDEX worker_endpoint_origin_reservations_origin_key ON worker_endpoint_origin_reservations (canonical_origin) WHERE ((status IN ('prepared', 'bound', 'activated')) OR ((status = 'expired') AND (endpoint_uid IS NOT NULL)));
CREATE INDEX operations_running_idx ON operations (organization_id, kind, external_key) WHERE (status = 'running');
CREATE UNIQUE INDEX workers_live_key ON workers (organization_id, space, name) WHERE (status <> 'deleted');
CREATE UNIQUE INDEX worker_endpoints_live_key ON worker_endpoints (organization_id, space, name) WHERE (status <> 'deleted');
CREATE INDEX worker_endpoints_worker_idx ON worker_endpoints (worker_uid) WHERE (status <> 'deleted');
CREATE INDEX runtime_input_preparations_reservation_idx ON runtime_input_preparations (organization_id, origin_reservation_id) WHERE (status = 'claimed');
CREATE INDEX runtime_input_preparations_worker_idx ON runtime_input_preparations (worker_uid) WHERE (status = 'claimed');
CREATE INDEX runtime_input_preparations_claim_op_idx ON runtime_input_preparations (claim_operation_id) WHERE (status IN ('claimed', 'dispatched'));
CREATE UNIQUE INDEX worker_endpoints_origin_key ON worker_endpoints (canonical_origin) WHERE (status <> 'deleted');
CREATE UNIQUE INDEX sealing_keys_one_current ON sealing_keys ((true)) WHERE (status = 'current');
CREATE UNIQUE INDEX workers_script_key ON workers (installation, script_name) WHERE ((status <> 'deleted') AND (NOT script_collision));
CREATE INDEX worker_endpoint_origin_reservations_live_idx ON worker_endpoint_origin_reservations (organization_id) WHERE (status IN ('prepared', 'bound', 'activated'));
CREATE INDEX runtime_input_preparations_pending_idx ON runtime_input_preparations (organization_id) WHERE (status IN ('prepared', 'claimed'));
CREATE INDEX workers_creating_operation_idx ON workers (operation_id) WHERE (status = 'creating');
CREATE INDEX worker_endpoints_creating_operation_idx ON worker_endpoints (operation_id) WHERE (status = 'creating');
CREATE INDEX workers_deleted_script_idx ON workers (installation, script_name) WHERE (status = 'deleted');
CREATE INDEX worker_endpoint_origin_reservations_minted_worker_idx ON worker_endpoint_origin_reservations (bound_worker_uid) WHERE (host_minted AND (status IN ('prepared', 'bound', 'expired')));
CREATE INDEX workers_installation_live_idx ON workers (installation) WHERE (status <> 'deleted');
CREATE INDEX deletion_attestations_closing_idx ON deletion_attestations (closes_at) WHERE ((status = 'open') AND (closes_at IS NOT NULL));

CREATE FUNCTION attestation_open(status attestation_status, closes_at timestamp with time zone, at timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
SELECT status = 'open' AND (closes_at IS NULL OR closes_at > at)
$function$;

CREATE FUNCTION resource_present(status resource_status, operation_status operation_status)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
SELECT status IN ('live', 'deleting') OR (status = 'creating' AND operation_status = 'running')
$function$;

CREATE FUNCTION reservation_published(reservation_status reservation_status, witness uuid)
 RETURNS boolean
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    RETURN reservation_status = 'activated'
        OR (witness IS NOT NULL AND EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
                                            WHERE e.uid = witness AND resource_present(e.status, o.status)));
END
$function$;

CREATE FUNCTION reservation_effective_status(reservation_status reservation_status, expires_at timestamp with time zone, witness uuid, at timestamp with time zone)
 RETURNS reservation_status
 LANGUAGE plpgsql
 STABLE
AS $function$
BEGIN
    IF reservation_status IN ('prepared', 'bound') AND expires_at <= at
       AND NOT reservation_published(reservation_status, witness) THEN
        RETURN 'expired';
    END IF;
    RETURN reservation_status;
END
$function$;

CREATE FUNCTION reservation_fences(org text, reservation_id text, reservation_status reservation_status, witness uuid, at timestamp with time zone, OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean, OUT attestation_open boolean, OUT deployment_live boolean)
 RETURNS record
 LANGUAGE sql
 STABLE
AS $function$
SELECT reservation_status = 'activated',
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > at),
       EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
               WHERE e.uid = witness
                 AND resource_present(e.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND attestation_open(a.status, a.closes_at, at)),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness
                 AND ((d.status NOT IN ('deleted', 'failed')
                       AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                                   WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
                      OR (d.status = 'deleted' AND d.routed_until > at)))
$function$;

-- The views as before, the deployment's status read as text (an absent one is '').
CREATE VIEW worker_states AS
SELECT w.*, resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status::text FROM deployments d
                 WHERE d.resource_uid = w.uid AND d.generation = w.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = w.uid AND d.generation = w.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id,
       p.status AS runtime_input_status,
       p.worker_uid AS runtime_input_worker_uid
FROM workers w
JOIN operations o ON o.id = w.operation_id
LEFT JOIN runtime_input_preparations p ON p.organization_id = w.organization_id AND p.reference = w.runtime_input_reference;

CREATE VIEW endpoint_states AS
SELECT e.*, resource_present(e.status, o.status) AS present,
       coalesce((SELECT d.status::text FROM deployments d
                 WHERE d.resource_uid = e.uid AND d.generation = e.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = e.uid AND d.generation = e.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id;
