# An endpoint is imported as space/name; the import adopts its ownership token.
tofu import takoform_worker_endpoint.api prod/api
