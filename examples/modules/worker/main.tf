# The whole graph of one worker, in the order the Host accepts it: a reservation holds the origin
# first, the runtime input seals the secrets for that origin, the worker consumes it, the endpoint
# publishes the worker on the reservation, and the activation proves it. Destroy runs in reverse.

locals {
  # The binding names decide the plan (whether a runtime input exists, what the worker requires),
  # so they come from values a plan may hold: the keys of secrets and the names given for
  # ephemeral_secrets, whose values only reach the write-only bindings_wo.
  secret_names = sort(setunion(nonsensitive(keys(var.secrets)), var.secret_names))
  has_secrets  = length(local.secret_names) > 0
  bindings     = merge(var.secrets, var.ephemeral_secrets)
}

resource "takoform_worker_endpoint_origin_reservation" "this" {
  space       = var.space
  worker_name = var.name
  subdomain   = var.subdomain
  hostname    = var.hostname
  offering_id = var.offering_id
}

# Everything that replaces the worker replaces its runtime input too, since a delivered runtime
# input belongs to one worker UID: its space, name and offering, and the ids of the workers it binds
# to (the provider replaces a caller whose callee is replaced, so `-replace` of a callee is one flag).
resource "terraform_data" "worker_identity" {
  input = {
    space            = var.space
    name             = var.name
    offering_id      = var.offering_id
    service_bindings = var.service_bindings
  }
}

# The one handle that replaces this worker on demand, with its runtime input:
# `tofu apply -replace=module.<name>.terraform_data.replace_worker`. (`-replace` of the worker
# alone fails at plan: its runtime input was delivered to the worker being replaced.)
resource "terraform_data" "replace_worker" {}

resource "takoform_worker_runtime_input" "this" {
  count = local.has_secrets ? 1 : 0

  space                   = var.space
  worker_name             = var.name
  endpoint_name           = var.name
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.this.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.this.canonical_origin
  bindings_wo             = local.bindings
  bindings_wo_version     = var.secrets_version

  lifecycle {
    replace_triggered_by = [terraform_data.worker_identity, terraform_data.replace_worker]
  }
}

resource "takoform_worker" "this" {
  space                   = var.space
  name                    = var.name
  main_module             = var.main_module
  modules                 = var.modules
  module_files            = var.module_files
  compatibility_date      = var.compatibility_date
  compatibility_flags     = var.compatibility_flags
  crons                   = var.crons
  vars                    = var.vars
  json_vars               = var.json_vars
  service_bindings        = var.service_bindings
  limits                  = var.limits
  offering_id             = var.offering_id
  required_sensitive_vars = local.has_secrets ? local.secret_names : null
  runtime_input_reference = local.has_secrets ? takoform_worker_runtime_input.this[0].reference : null

  lifecycle {
    replace_triggered_by = [terraform_data.replace_worker]
    # Checked on the worker, which always exists: ephemeral_secrets given without their names
    # would otherwise be dropped without a word.
    precondition {
      condition     = toset(keys(local.bindings)) == toset(local.secret_names) && length(keys(local.bindings)) == length(keys(var.secrets)) + length(keys(var.ephemeral_secrets))
      error_message = "secret_names must name exactly the keys of ephemeral_secrets, and a name may be in secrets or in ephemeral_secrets, not both."
    }
  }
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
