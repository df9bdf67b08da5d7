-- Back to rip1 only: rip2 preparations cannot be kept (their references would fail the old check).
DELETE FROM runtime_input_preparations WHERE reference LIKE 'rip2.%';
ALTER TABLE runtime_input_preparations DROP CONSTRAINT runtime_input_preparations_reference_check;
ALTER TABLE runtime_input_preparations ADD CONSTRAINT runtime_input_preparations_reference_check CHECK (
    reference ~ '^rip1\.prep-[0-9a-f]{32}\.[0-9a-f]{64}$');
DROP TABLE runtime_input_commitment_secrets;
