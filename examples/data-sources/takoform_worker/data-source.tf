data "takoform_worker" "api" {
  space = "prod"
  name  = "api"
}

output "api_ready" {
  value = data.takoform_worker.api.ready
}
