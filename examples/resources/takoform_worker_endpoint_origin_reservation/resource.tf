# Hold the worker's origin before the worker exists. canonical_origin is known at plan time; a plan
# fails when someone else holds it.
resource "takoform_worker_endpoint_origin_reservation" "api" {
  space       = "prod"
  worker_name = "api"
  # subdomain = "api" # omitted: the backend's derived label for the worker
  ttl = "24h"
}
