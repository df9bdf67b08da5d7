output "url" {
  description = "The worker's public URL."
  value       = takoform_worker_endpoint.this.url
}

output "canonical_origin" {
  description = "The origin the reservation holds, known at plan time."
  value       = takoform_worker_endpoint_origin_reservation.this.canonical_origin
}

output "worker_id" {
  description = "The worker's UID."
  value       = takoform_worker.this.id
}

output "reservation_id" {
  description = "The reservation that holds the origin."
  value       = takoform_worker_endpoint_origin_reservation.this.id
}
