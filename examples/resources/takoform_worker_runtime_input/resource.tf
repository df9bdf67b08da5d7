# Secrets come in through an ephemeral variable (or an ephemeral resource): write-only bindings_wo
# takes them, and no plan or state ever holds them.
variable "stripe_key" {
  type      = string
  sensitive = true
  ephemeral = true
}

resource "takoform_worker_runtime_input" "api" {
  space                   = "prod"
  worker_name             = "api"
  endpoint_name           = "api"
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.api.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.api.canonical_origin

  bindings_wo = {
    STRIPE_KEY = var.stripe_key
  }
  # Bump to re-seal the values under a new reference (rotation): the runtime input is replaced and
  # the worker updated in place.
  bindings_wo_version = 1
}
