DROP TABLE runtime_pools;
