DROP TABLE runtime_node_events;
DROP TABLE runtime_nodes;
DROP TYPE runtime_node_state;
