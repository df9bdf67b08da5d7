provider "takoform" {
  # Defaults to TAKOFORM_ENDPOINT.
  endpoint = "http://127.0.0.1:8080"
  # Prefer TAKOFORM_API_KEY to writing the key here.
  # api_key = var.takoform_api_key
  # Optional (or TAKOFORM_ORGANIZATION_ID): the organization the key must belong to; the Host states it.
  # organization_id = "org_..."
  request_timeout = "30s"
  max_retries     = 4
}
