DROP FUNCTION reservation_fences;
DROP TABLE runtime_input_preparations;
