ALTER TABLE operations ADD CONSTRAINT operations_organization_id_fkey FOREIGN KEY (organization_id) REFERENCES organizations (id);
ALTER TABLE ownership_bindings ADD CONSTRAINT ownership_bindings_organization_id_fkey FOREIGN KEY (organization_id) REFERENCES organizations (id);
ALTER TABLE ownership_tombstones ADD CONSTRAINT ownership_tombstones_organization_id_fkey FOREIGN KEY (organization_id) REFERENCES organizations (id);
ALTER TABLE deployments DROP COLUMN seq, DROP COLUMN route_script;
DROP VIEW endpoint_states;
DROP VIEW worker_states;
DROP FUNCTION reservation_effective_status;
DROP FUNCTION ownership_lock;
DROP FUNCTION reservation_published;
DROP FUNCTION worker_fences;
CREATE OR REPLACE FUNCTION reservation_fences(org text, reservation_id text, reservation_status text, witness uuid,
                                              OUT activation boolean, OUT lease_claimed boolean, OUT endpoint_present boolean,
                                              OUT attestation_open boolean, OUT deployment_live boolean)
LANGUAGE sql STABLE AS $$
SELECT reservation_status = 'activated',
       EXISTS (SELECT 1 FROM runtime_input_preparations p
               WHERE p.organization_id = org AND p.origin_reservation_id = reservation_id
                 AND p.status = 'claimed' AND p.claim_expires_at > now()),
       EXISTS (SELECT 1 FROM worker_endpoints e JOIN operations o ON o.id = e.operation_id
               WHERE e.uid = witness
                 AND resource_present(e.status, o.status)),
       EXISTS (SELECT 1 FROM deletion_attestations a WHERE a.uid = witness AND a.status = 'open'),
       EXISTS (SELECT 1 FROM deployments d
               WHERE d.resource_uid = witness AND d.status NOT IN ('deleted', 'failed')
                 AND EXISTS (SELECT 1 FROM backend_effects x JOIN operations o ON o.id = x.operation_id
                             WHERE x.deployment_id = d.id AND (o.status <> 'refused' OR x.status = 'succeeded')))
$$;
DROP INDEX runtime_input_preparations_reference_key;
DROP TABLE sealing_keys;
CREATE TABLE brakes (
    name       text PRIMARY KEY CHECK (name IN ('deployment', 'lifecycle')),
    engaged    boolean NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO brakes (name, engaged) VALUES
    ('deployment', EXISTS (SELECT 1 FROM deployment_brakes WHERE scope = '*')),
    ('lifecycle', false);
DROP TABLE deployment_brakes;
UPDATE backend_effects SET status = 'failed' WHERE status = 'unobservable';
ALTER TABLE backend_effects DROP CONSTRAINT backend_effects_status_check,
    ADD CONSTRAINT backend_effects_status_check CHECK (status IN ('planned', 'dispatched', 'succeeded', 'failed'));
DROP INDEX worker_endpoints_origin_key;
ALTER TABLE ownership_bindings
    DROP CONSTRAINT ownership_bindings_response_status_check,
    ALTER COLUMN response_status DROP NOT NULL,
    ALTER COLUMN response_body DROP NOT NULL,
    ADD COLUMN state text NOT NULL DEFAULT 'complete' CHECK (state IN ('pending', 'complete')),
    ADD CONSTRAINT ownership_bindings_response_check CHECK (
        state = 'pending' OR (response_status BETWEEN 200 AND 299 AND response_body IS NOT NULL)
    );
DROP TABLE ownership_intents;
DROP FUNCTION db_now;
DROP TABLE clock_skew;
