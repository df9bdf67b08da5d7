DROP TABLE late_write_rechecks;
DROP TYPE late_write_status;
