# A worker is imported as space/name; the import adopts its ownership token.
tofu import takoform_worker.api prod/api
