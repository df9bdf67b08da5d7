# Quickstart: the full graph of one worker on a Host. `takoserver dev` prints how to export
# TAKOFORM_ENDPOINT and TAKOFORM_API_KEY, which configure the provider.
#
#   tofu init && tofu apply    # reserve, seal, deploy, publish, activate
#   curl "$(tofu output -raw url)"
#   curl -N -H "Authorization: Bearer $TAKOFORM_API_KEY" "$(tofu output -raw logs_url)?follow=true"
#   tofu destroy               # in the order the Host accepts
terraform {
  required_version = ">= 1.11"
  required_providers {
    takoform = {
      source = "takoform/takoform"
    }
  }
}

provider "takoform" {}

variable "greeting" {
  description = "The worker's secret. Ephemeral: no plan or state keeps it."
  type        = string
  sensitive   = true
  ephemeral   = true
  default     = "hello from a sealed secret"
}

variable "greeting_version" {
  description = "Bump to re-seal the greeting under a new reference."
  type        = number
  default     = 1
}

# 1. Hold the origin first: known at plan time, and the plan fails if someone else holds it.
resource "takoform_worker_endpoint_origin_reservation" "hello" {
  space       = "demo"
  worker_name = "hello"
}

# 2. Seal the secret for that origin. bindings_wo is write-only: the value never enters the state.
resource "takoform_worker_runtime_input" "hello" {
  space                   = "demo"
  worker_name             = "hello"
  endpoint_name           = "hello"
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.hello.id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.hello.canonical_origin
  bindings_wo             = { GREETING = var.greeting }
  bindings_wo_version     = var.greeting_version
}

# 3. The worker consumes the runtime input; its reference is known at plan time.
resource "takoform_worker" "hello" {
  space       = "demo"
  name        = "hello"
  main_module = "index.js"
  modules = {
    "index.js" = <<-JS
      // It shows that it received its secret by length and digest, never by value.
      export default {
        async fetch(request, env) {
          console.log(request.method + " " + new URL(request.url).pathname); // in its logs_url
          const sum = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(env.GREETING));
          const hex = [...new Uint8Array(sum)].map((b) => b.toString(16).padStart(2, "0")).join("");
          return new Response(`Hello from Takoform! My secret has $${env.GREETING.length} characters, SHA-256 $${hex}.\n`);
        },
      };
    JS
  }
  compatibility_date      = "2025-01-01"
  required_sensitive_vars = ["GREETING"]
  runtime_input_reference = takoform_worker_runtime_input.hello.reference
}

# 4. Publish the worker on the reserved origin.
resource "takoform_worker_endpoint" "hello" {
  space                 = "demo"
  name                  = "hello"
  worker                = takoform_worker.hello.name
  worker_id             = takoform_worker.hello.id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.hello.id
}

# 5. Prove that this endpoint publishes the origin.
resource "takoform_worker_endpoint_activation" "hello" {
  reservation_id = takoform_worker_endpoint_origin_reservation.hello.id
  endpoint_id    = takoform_worker_endpoint.hello.id
}

output "url" {
  description = "The worker's public URL."
  value       = takoform_worker_endpoint.hello.url
}

output "logs_url" {
  description = "The worker's log on the Host (read it with the API key; add ?follow=true to keep it open)."
  value       = takoform_worker.hello.logs_url
}

output "canonical_origin" {
  description = "The origin the reservation holds."
  value       = takoform_worker_endpoint_origin_reservation.hello.canonical_origin
}

output "runtime_input_reference" {
  description = "The sealed secret's reference (a digest, never the value)."
  value       = takoform_worker_runtime_input.hello.reference
}
