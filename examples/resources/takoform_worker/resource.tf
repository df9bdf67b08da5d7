resource "takoform_worker" "api" {
  space       = "prod"
  name        = "api"
  main_module = "index.js"
  module_files = {
    "index.js" = "${path.module}/src/index.js"
  }
  compatibility_date  = "2025-01-01"
  compatibility_flags = ["nodejs_compat"]

  # Configuration, not secrets: the plan shows these. A change updates the worker in place.
  vars      = { LOG_LEVEL = "info" }
  json_vars = { LIMITS = jsonencode({ requests_per_second = 50 }) }

  # env.AUTH.fetch(request) reaches the auth worker. Destroy removes this worker first; replacing
  # the auth worker replaces this one with it.
  service_bindings = { AUTH = takoform_worker.auth.id }

  # Within the offering's ceilings (data source takoform_offerings): a request ends after 2 s.
  limits = { cpu_ms = 2000 }

  # The worker requires these secrets; its runtime input delivers them.
  required_sensitive_vars = ["STRIPE_KEY"]
  runtime_input_reference = takoform_worker_runtime_input.api.reference
}
