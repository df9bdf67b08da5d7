DROP TABLE worker_kept_bundles;
