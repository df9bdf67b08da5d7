-- rip2 runtime-input references (SPEC 3.5). A reference commits each binding value as an HMAC under
-- a key derived from a commitment secret of the Host's, so that a plan or a state file says nothing
-- a guess could be tested against. The secret is 32 random bytes wrapped (AES-256-GCM) by the
-- key-encryption key, like the data keys, but never rotated with them: a reference carries the id
-- of the secret it was made under, and every reference made must stay checkable. One is current.
CREATE TABLE runtime_input_commitment_secrets (
    id             text PRIMARY KEY CHECK (id ~ '^c[0-9]{14}-[0-9a-f]{8}$'),
    kek_id         text NOT NULL,
    wrapped_secret bytea NOT NULL,
    current        boolean NOT NULL DEFAULT true,
    created_at     timestamptz NOT NULL DEFAULT now()
);

CREATE UNIQUE INDEX runtime_input_commitment_secrets_one_current ON runtime_input_commitment_secrets ((true)) WHERE current;

ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_reference_check;
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_reference_check CHECK (
    reference ~ '^rip1\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$'
    OR reference ~ '^rip2\.c[0-9]{14}-[0-9a-f]{8}\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$');
