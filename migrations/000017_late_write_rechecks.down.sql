DROP TABLE late_write_rechecks;
