import {
  to = takoform_worker_endpoint_origin_reservation.api
  id = "res-0123456789abcdef"
}
