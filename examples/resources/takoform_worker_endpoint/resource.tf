resource "takoform_worker_endpoint" "api" {
  space  = "prod"
  name   = "api"
  worker = takoform_worker.api.name
  # Replacing the worker replaces its endpoint.
  worker_id             = takoform_worker.api.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.api.id
}

output "url" {
  value = takoform_worker_endpoint.api.url
}
