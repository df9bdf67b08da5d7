resource "takoform_worker_endpoint_activation" "api" {
  reservation_id = takoform_worker_endpoint_origin_reservation.api.id
  # Replacing the endpoint replaces the activation, and destroy removes the activation first.
  endpoint_id = takoform_worker_endpoint.api.id
}
