-- Migration 7's lock step alone (Hosts of that version read first without a lock).
DROP FUNCTION ownership_lock(text, text, text, text, text, text, text, boolean);
