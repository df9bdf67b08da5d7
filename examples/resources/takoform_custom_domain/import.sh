# A claim is imported by its hostname.
tofu import takoform_custom_domain.shop shop.example.com
