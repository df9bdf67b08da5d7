# A worker on Cloudflare: the same module and the same graph as on a self-host node, on the
# offerings an operator sells on a Cloudflare installation (workers-dev: the account's
# workers.dev subdomain; wfp-managed: a dispatch namespace under the operator's base domain).
# Moving a worker between backends is a change of offering_id: it replaces the worker, its
# runtime input, endpoint and reservation, and the worker gets the new installation's origin.
#
#   tofu init && tofu apply -var offering_id=cloudflare-workers-dev
#   curl "$(tofu output -raw url)"
#   tofu destroy -var offering_id=cloudflare-workers-dev
#
# `tofu output` and `data "takoform_offerings"` list what your organization is sold.
terraform {
  required_version = ">= 1.11"
  required_providers {
    takoform = {
      source = "takoform/takoform"
    }
  }
}

provider "takoform" {}

variable "offering_id" {
  description = "The module-worker offering to run on (its endpoint is on the same installation)."
  type        = string
}

variable "greeting" {
  description = "The worker's secret. Ephemeral: no plan or state keeps it."
  type        = string
  sensitive   = true
  ephemeral   = true
  default     = "hello from a sealed secret"
}

variable "greeting_version" {
  description = "Bump to re-seal the greeting and deliver it again."
  type        = number
  default     = 1
}

module "hello" {
  source = "../modules/worker"

  space              = "demo"
  name               = "hello"
  offering_id        = var.offering_id
  main_module        = "index.js"
  module_files       = { "index.js" = "${path.module}/index.js" }
  compatibility_date = "2025-01-01"
  ephemeral_secrets  = { GREETING = var.greeting }
  secret_names       = ["GREETING"]
  secrets_version    = var.greeting_version
}

output "url" {
  description = "The worker's public URL on Cloudflare."
  value       = module.hello.url
}

output "canonical_origin" {
  description = "The origin the reservation holds, known at plan time."
  value       = module.hello.canonical_origin
}
