-- A request whose Host stopped mid-way (its operation abandoned, then settled by recovery) is
-- retried by its owner with the same token and body, and so with the If-Match revision it began
-- from. Its abandoned attempt may have moved the object's revision already (a worker's new
-- generation is written before its deployment). The operation records a digest of its owner's
-- token and its request (SHA-256, never the token itself), so that the retry is recognised as the
-- same request and goes on from where the attempt stopped instead of meeting revision_conflict
-- (issue 34 item 1).
ALTER TABLE operations ADD COLUMN request_digest bytea;
