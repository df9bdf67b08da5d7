DROP TABLE worker_endpoint_origin_reservations;
DROP TABLE ownership_tombstones;
DROP TABLE ownership_bindings;
DROP TABLE api_keys;
DROP TABLE organizations;
