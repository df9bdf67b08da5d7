# Read a reservation, Host-minted ones too.
data "takoform_worker_endpoint_origin_reservation" "minted" {
  id = takoform_worker_endpoint.site.origin_reservation_id
}

output "origin" {
  value = data.takoform_worker_endpoint_origin_reservation.minted.canonical_origin
}
