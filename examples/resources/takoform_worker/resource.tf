resource "takoform_worker" "api" {
  space       = "prod"
  name        = "api"
  main_module = "index.js"
  module_files = {
    "index.js" = "${path.module}/src/index.js"
  }
  compatibility_date = "2025-01-01"

  # The worker requires these secrets; its runtime input delivers them.
  required_sensitive_vars = ["STRIPE_KEY"]
  runtime_input_reference = takoform_worker_runtime_input.api.reference
}
