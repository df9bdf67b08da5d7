# A reservation is imported by its id; the import adopts its ownership token.
tofu import takoform_worker_endpoint_origin_reservation.api res-0123456789abcdef
