data "takoform_offerings" "all" {}

output "worker_offerings" {
  value = [for o in data.takoform_offerings.all.offerings : o.id if o.kind == "module-worker"]
}
