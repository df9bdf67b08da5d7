# A worker on your own domain (SPEC 3.7). Claim the name, publish the records the claim gives
# (normally with your DNS provider's record resources in this same configuration), and the worker
# is served at https://<hostname>/ once the Host has verified the name:
#
#   tofu apply -target=takoform_custom_domain.app   # the claim, pending: see the records to publish
#   tofu output records                             # publish them at your DNS host
#   tofu apply                                      # waits for verified, then deploys
#   curl https://app.example.com/
terraform {
  required_version = ">= 1.11"
  required_providers {
    takoform = {
      source = "takoform/takoform"
    }
  }
}

provider "takoform" {}

variable "hostname" {
  description = "A name you control."
  type        = string
  default     = "app.example.com"
}

resource "takoform_custom_domain" "app" {
  hostname = var.hostname
}

# Waits until the Host found the TXT record; the worker's reservation takes its hostname, so it
# is created only then.
resource "takoform_custom_domain_verification" "app" {
  hostname = takoform_custom_domain.app.hostname
  timeouts {
    create = "10m"
  }
}

module "app" {
  source   = "../modules/worker"
  space    = "demo"
  name     = "app"
  hostname = takoform_custom_domain_verification.app.hostname
  modules = {
    "index.js" = <<-JS
      export default {
        async fetch(request) {
          return new Response("hello from " + new URL(request.url).hostname + "\n");
        }
      };
    JS
  }
}

output "records" {
  description = "The records to publish: the TXT record that proves the name is yours, and where to point it."
  value       = takoform_custom_domain.app.dns_records
}

output "txt_name" {
  value = takoform_custom_domain.app.txt_name
}

output "txt_value" {
  value = takoform_custom_domain.app.txt_value
}

output "url" {
  value = module.app.url
}
