# Claim a name the organization controls. The claim is created pending; publish its TXT record
# (here through a DNS provider's record resource) and the Host verifies it.
resource "takoform_custom_domain" "shop" {
  hostname = "shop.example.com"
}

output "publish" {
  value = {
    txt   = { name = takoform_custom_domain.shop.txt_name, value = takoform_custom_domain.shop.txt_value }
    point = [for r in takoform_custom_domain.shop.dns_records : r if r.type != "TXT"]
  }
}
