# Wait until the claim is verified, then hold the name as a worker's origin.
resource "takoform_custom_domain_verification" "shop" {
  hostname = takoform_custom_domain.shop.hostname
  timeouts {
    create = "30m"
  }
}

resource "takoform_worker_endpoint_origin_reservation" "shop" {
  space       = "prod"
  worker_name = "shop"
  hostname    = takoform_custom_domain_verification.shop.hostname # https://shop.example.com
}
