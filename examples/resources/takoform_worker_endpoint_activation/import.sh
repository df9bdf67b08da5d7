# An activation is imported by its reservation's id.
tofu import takoform_worker_endpoint_activation.api res-0123456789abcdef
