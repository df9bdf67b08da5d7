DROP TABLE worker_service_bindings;
