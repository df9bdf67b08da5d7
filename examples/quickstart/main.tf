# Quickstart: point the provider at a Host (`takoserver dev` prints the two variables to export)
# and read the catalog. Workers, endpoints and reservations join this example as the provider
# gains those resources.
terraform {
  required_version = ">= 1.11"
  required_providers {
    takoform = {
      source = "takoform/takoform"
    }
  }
}

# endpoint and api_key come from TAKOFORM_ENDPOINT and TAKOFORM_API_KEY.
provider "takoform" {}

data "takoform_offerings" "all" {}

output "offerings" {
  description = "The offerings the Host sells to this organization."
  value       = { for o in data.takoform_offerings.all.offerings : o.id => "${o.kind} on ${o.pack}/${o.installation}" }
}
