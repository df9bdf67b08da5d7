provider "takoform" {
  # Defaults to TAKOFORM_ENDPOINT.
  endpoint = "http://127.0.0.1:8080"
  # Prefer TAKOFORM_API_KEY to writing the key here.
  # api_key = var.takoform_api_key
  request_timeout = "30s"
  max_retries     = 4
}
