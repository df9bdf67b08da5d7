-- Back to text columns with their CHECKs, views, indexes and functions as migration 000015 left
-- them (the endpoint kind is renamed back below).
DROP VIEW worker_states;
DROP VIEW endpoint_states;
DROP FUNCTION resource_present(resource_status, operation_status);
DROP FUNCTION reservation_published(reservation_status, uuid);
DROP FUNCTION reservation_effective_status(reservation_status, timestamptz, uuid, timestamptz);
DROP FUNCTION reservation_fences(text, text, reservation_status, uuid, timestamptz);
DROP FUNCTION attestation_open(attestation_status, timestamptz, timestamptz);

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
ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_check;
ALTER TABLE operations DROP CONSTRAINT operations_check;
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_check;
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_check2;
ALTER TABLE sealing_keys DROP CONSTRAINT sealing_keys_check;
ALTER TABLE worker_endpoint_origin_reservations DROP CONSTRAINT worker_endpoint_origin_reservations_check2;
ALTER TABLE worker_endpoint_origin_reservations DROP CONSTRAINT worker_endpoint_origin_reservations_check3;

ALTER TABLE operations ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE workers ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE worker_endpoints ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE worker_endpoint_origin_reservations ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE deployments ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE deployments ALTER COLUMN resource_kind TYPE text USING resource_kind::text;
ALTER TABLE deletion_attestations ALTER COLUMN resource_kind TYPE text USING resource_kind::text;
ALTER TABLE backend_effects ALTER COLUMN action TYPE text USING action::text;
ALTER TABLE backend_effects ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE deletion_attestations ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE runtime_input_preparations ALTER COLUMN status TYPE text USING status::text;
ALTER TABLE sealing_keys ALTER COLUMN status TYPE text USING status::text;

ALTER TABLE backend_effects ADD CONSTRAINT backend_effects_action_check CHECK ((action = ANY (ARRAY['apply'::text, 'delete'::text])));
ALTER TABLE backend_effects ADD CONSTRAINT backend_effects_status_check CHECK ((status = ANY (ARRAY['planned'::text, 'dispatched'::text, 'succeeded'::text, 'failed'::text, 'unobservable'::text])));
ALTER TABLE deletion_attestations ADD CONSTRAINT deletion_attestations_check CHECK (((status = 'closed'::text) = (closed_at IS NOT NULL)));
ALTER TABLE deletion_attestations ADD CONSTRAINT deletion_attestations_resource_kind_check CHECK ((resource_kind = ANY (ARRAY['worker'::text, 'worker-endpoint'::text])));
ALTER TABLE deletion_attestations ADD CONSTRAINT deletion_attestations_status_check CHECK ((status = ANY (ARRAY['open'::text, 'closed'::text])));
ALTER TABLE deployments ADD CONSTRAINT deployments_resource_kind_check CHECK ((resource_kind = ANY (ARRAY['worker'::text, 'worker-endpoint'::text])));
ALTER TABLE deployments ADD CONSTRAINT deployments_status_check CHECK ((status = ANY (ARRAY['pending'::text, 'active'::text, 'deleting'::text, 'deleted'::text, 'failed'::text])));
ALTER TABLE operations ADD CONSTRAINT operations_check CHECK (((status = 'running'::text) = (finished_at IS NULL)));
ALTER TABLE operations ADD CONSTRAINT operations_status_check CHECK ((status = ANY (ARRAY['running'::text, 'committed'::text, 'refused'::text])));
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_check CHECK (((status = ANY (ARRAY['prepared'::text, 'claimed'::text])) = (ciphertext IS NOT NULL)));
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_check2 CHECK (((status = ANY (ARRAY['prepared'::text, 'aborted'::text, 'expired'::text])) OR (worker_uid IS NOT NULL) OR (status = 'failed'::text)));
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_status_check CHECK ((status = ANY (ARRAY['prepared'::text, 'claimed'::text, 'dispatched'::text, 'settled'::text, 'aborted'::text, 'expired'::text, 'failed'::text])));
ALTER TABLE sealing_keys ADD CONSTRAINT sealing_keys_check CHECK (((status = 'retired'::text) = (wrapped_key IS NULL)));
ALTER TABLE sealing_keys ADD CONSTRAINT sealing_keys_status_check CHECK ((status = ANY (ARRAY['current'::text, 'previous'::text, 'retired'::text])));
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_check2 CHECK (((status <> ALL (ARRAY['bound'::text, 'activated'::text])) OR (bound_worker_uid IS NOT NULL)));
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_check3 CHECK (((status <> 'activated'::text) OR (endpoint_uid IS NOT NULL)));
ALTER TABLE worker_endpoint_origin_reservations ADD CONSTRAINT worker_endpoint_origin_reservations_status_check CHECK ((status = ANY (ARRAY['prepared'::text, 'bound'::text, 'activated'::text, 'expired'::text, 'released'::text])));
ALTER TABLE worker_endpoints ADD CONSTRAINT worker_endpoints_status_check CHECK ((status = ANY (ARRAY['creating'::text, 'live'::text, 'deleting'::text, 'deleted'::text])));
ALTER TABLE workers ADD CONSTRAINT workers_status_check CHECK ((status = ANY (ARRAY['creating'::text, 'live'::text, 'deleting'::text, 'deleted'::text])));

CREATE UNIQUE INDEX worker_endpoint_origin_reservations_worker_key ON public.worker_endpoint_origin_reservations USING btree (organization_id, space, worker_name) WHERE ((status = ANY (ARRAY['prepared'::text, 'bound'::text, 'activated'::text])) OR ((status = 'expired'::text) AND (endpoint_uid IS NOT NULL)));
CREATE UNIQUE INDEX worker_endpoint_origin_reservations_origin_key ON public.worker_endpoint_origin_reservations USING btree (canonical_origin) WHERE ((status = ANY (ARRAY['prepared'::text, 'bound'::text, 'activated'::text])) OR ((status = 'expired'::text) AND (endpoint_uid IS NOT NULL)));
CREATE INDEX operations_running_idx ON public.operations USING btree (organization_id, kind, external_key) WHERE (status = 'running'::text);
CREATE UNIQUE INDEX workers_live_key ON public.workers USING btree (organization_id, space, name) WHERE (status <> 'deleted'::text);
CREATE UNIQUE INDEX worker_endpoints_live_key ON public.worker_endpoints USING btree (organization_id, space, name) WHERE (status <> 'deleted'::text);
CREATE INDEX worker_endpoints_worker_idx ON public.worker_endpoints USING btree (worker_uid) WHERE (status <> 'deleted'::text);
CREATE INDEX runtime_input_preparations_reservation_idx ON public.runtime_input_preparations USING btree (organization_id, origin_reservation_id) WHERE (status = 'claimed'::text);
CREATE INDEX runtime_input_preparations_worker_idx ON public.runtime_input_preparations USING btree (worker_uid) WHERE (status = 'claimed'::text);
CREATE INDEX runtime_input_preparations_claim_op_idx ON public.runtime_input_preparations USING btree (claim_operation_id) WHERE (status = ANY (ARRAY['claimed'::text, 'dispatched'::text]));
CREATE UNIQUE INDEX worker_endpoints_origin_key ON public.worker_endpoints USING btree (canonical_origin) WHERE (status <> 'deleted'::text);
CREATE UNIQUE INDEX sealing_keys_one_current ON public.sealing_keys USING btree ((true)) WHERE (status = 'current'::text);
CREATE UNIQUE INDEX workers_script_key ON public.workers USING btree (installation, script_name) WHERE ((status <> 'deleted'::text) AND (NOT script_collision));
CREATE INDEX worker_endpoint_origin_reservations_live_idx ON public.worker_endpoint_origin_reservations USING btree (organization_id) WHERE (status = ANY (ARRAY['prepared'::text, 'bound'::text, 'activated'::text]));
CREATE INDEX runtime_input_preparations_pending_idx ON public.runtime_input_preparations USING btree (organization_id) WHERE (status = ANY (ARRAY['prepared'::text, 'claimed'::text]));
CREATE INDEX workers_creating_operation_idx ON public.workers USING btree (operation_id) WHERE (status = 'creating'::text);
CREATE INDEX worker_endpoints_creating_operation_idx ON public.worker_endpoints USING btree (operation_id) WHERE (status = 'creating'::text);
CREATE INDEX workers_deleted_script_idx ON public.workers USING btree (installation, script_name) WHERE (status = 'deleted'::text);
CREATE INDEX worker_endpoint_origin_reservations_minted_worker_idx ON public.worker_endpoint_origin_reservations USING btree (bound_worker_uid) WHERE (host_minted AND (status = ANY (ARRAY['prepared'::text, 'bound'::text, 'expired'::text])));
CREATE INDEX workers_installation_live_idx ON public.workers USING btree (installation) WHERE (status <> 'deleted'::text);
CREATE INDEX deletion_attestations_closing_idx ON public.deletion_attestations USING btree (closes_at) WHERE ((status = 'open'::text) AND (closes_at IS NOT NULL));

CREATE OR REPLACE FUNCTION public.attestation_open(status text, closes_at timestamp with time zone, at timestamp with time zone)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
SELECT status = 'open' AND (closes_at IS NULL OR closes_at > at)
$function$;

CREATE OR REPLACE FUNCTION public.resource_present(status text, operation_status text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE
AS $function$
SELECT status IN ('live', 'deleting') OR (status = 'creating' AND operation_status = 'running')
$function$;

CREATE OR REPLACE FUNCTION public.reservation_published(reservation_status text, witness uuid)
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

CREATE OR REPLACE FUNCTION public.reservation_effective_status(reservation_status text, expires_at timestamp with time zone, witness uuid, at timestamp with time zone)
 RETURNS text
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

CREATE OR REPLACE FUNCTION public.reservation_fences(org text, reservation_id text, reservation_status text, witness uuid, at timestamp with time zone, OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean, OUT attestation_open boolean, OUT deployment_live boolean)
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

-- The views as migration 000008 (worker_states) and 000004 (endpoint_states) made them.
CREATE VIEW worker_states AS
SELECT w.*, resource_present(w.status, o.status) AS present,
       coalesce((SELECT d.status FROM deployments d
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
       coalesce((SELECT d.status FROM deployments d
                 WHERE d.resource_uid = e.uid AND d.generation = e.generation
                 ORDER BY d.created_at DESC, d.id LIMIT 1), '')::text AS deployment_status,
       (SELECT d.id FROM deployments d
        WHERE d.resource_uid = e.uid AND d.generation = e.generation
        ORDER BY d.created_at DESC, d.id LIMIT 1) AS deployment_id
FROM worker_endpoints e
JOIN operations o ON o.id = e.operation_id;


DROP TYPE sealing_key_status;
DROP TYPE runtime_input_status;
DROP TYPE attestation_status;
DROP TYPE effect_status;
DROP TYPE effect_action;
DROP TYPE resource_kind;
DROP TYPE deployment_status;
DROP TYPE reservation_status;
DROP TYPE resource_status;
DROP TYPE operation_status;

ALTER TABLE deletion_attestations DROP CONSTRAINT deletion_attestations_resource_kind_check;
ALTER TABLE deployments DROP CONSTRAINT deployments_resource_kind_check;
UPDATE deletion_attestations SET resource_kind = 'endpoint' WHERE resource_kind = 'worker-endpoint';
UPDATE deployments SET resource_kind = 'endpoint' WHERE resource_kind = 'worker-endpoint';
ALTER TABLE deletion_attestations
    ADD CONSTRAINT deletion_attestations_resource_kind_check CHECK (resource_kind IN ('worker', 'endpoint'));
ALTER TABLE deployments
    ADD CONSTRAINT deployments_resource_kind_check CHECK (resource_kind IN ('worker', 'endpoint'));
