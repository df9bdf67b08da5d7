# The whole graph of one worker, in the order the Host accepts it: a reservation holds the origin
# first, the runtime input seals the secrets for that origin, the worker consumes it, the endpoint
# publishes the worker on the reservation, and the activation proves it. Destroy runs in reverse.

locals {
  has_secrets = length(nonsensitive(keys(var.secrets))) > 0
}

resource "takoform_worker_endpoint_origin_reservation" "this" {
  space       = var.space
  worker_name = var.name
  subdomain   = var.subdomain
  offering_id = var.offering_id
}

# Everything that replaces the worker (space, name, offering) replaces its runtime input too: a
# delivered runtime input belongs to one worker UID.
resource "terraform_data" "worker_identity" {
  input = {
    space       = var.space
    name        = var.name
    offering_id = var.offering_id
  }
}

resource "takoform_worker_runtime_input" "this" {
  count = local.has_secrets ? 1 : 0

  space                   = var.space
  worker_name             = var.name
  endpoint_name           = var.name
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.this.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.this.canonical_origin
  bindings_wo             = var.secrets
  bindings_wo_version     = var.secrets_version

  lifecycle {
    replace_triggered_by = [terraform_data.worker_identity]
  }
}

resource "takoform_worker" "this" {
  space                   = var.space
  name                    = var.name
  main_module             = var.main_module
  modules                 = var.modules
  compatibility_date      = var.compatibility_date
  offering_id             = var.offering_id
  required_sensitive_vars = local.has_secrets ? nonsensitive(keys(var.secrets)) : null
  runtime_input_reference = local.has_secrets ? takoform_worker_runtime_input.this[0].reference : null
}

resource "takoform_worker_endpoint" "this" {
  space                 = var.space
  name                  = var.name
  worker                = takoform_worker.this.name
  worker_id             = takoform_worker.this.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.this.id
}

resource "takoform_worker_endpoint_activation" "this" {
  reservation_id = takoform_worker_endpoint_origin_reservation.this.id
  endpoint_id    = takoform_worker_endpoint.this.id
}
