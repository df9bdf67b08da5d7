variable "space" {
  description = "Space of the worker (prod, staging, ...)."
  type        = string
}

variable "name" {
  description = "Name of the worker; its endpoint takes the same name."
  type        = string
}

variable "modules" {
  description = "The worker's modules inline: source by module name. Give this or module_files."
  type        = map(string)
  default     = null
}

variable "module_files" {
  description = "The worker's modules from files: path by module name, read by the provider. The plan then shows paths and digests instead of sources. Give this or modules."
  type        = map(string)
  default     = null
}

variable "main_module" {
  description = "The entry module, one of the keys of modules."
  type        = string
  default     = "index.js"
}

variable "compatibility_date" {
  description = "Workers runtime compatibility date."
  type        = string
  default     = "2025-01-01"
}

variable "secrets" {
  description = "Secret bindings by name. They are sealed by the Host and reach the worker's environment; they never enter the state."
  type        = map(string)
  default     = {}
  sensitive   = true
}

variable "ephemeral_secrets" {
  description = "Secret bindings by name, from ephemeral values (an `ephemeral = true` variable or an ephemeral resource): they reach the Host through the write-only bindings and no plan file, state or log keeps them. Name each one in secret_names too, since an ephemeral value cannot decide what the plan holds."
  type        = map(string)
  default     = {}
  nullable    = false
  sensitive   = true
  ephemeral   = true
}

variable "secret_names" {
  description = "The names of ephemeral_secrets (exactly its keys). The names are not secret: they become the worker's required_sensitive_vars."
  type        = set(string)
  default     = []
  nullable    = false
}

variable "secrets_version" {
  description = "Bump to re-seal the secrets under a new reference (rotation)."
  type        = number
  default     = 1
}

variable "subdomain" {
  description = "DNS label of the worker's origin; null for the backend's derived label."
  type        = string
  default     = null
}

variable "hostname" {
  description = "A verified custom domain of the organization (or one name under a verified wildcard) to serve the worker at, instead of a subdomain: pass takoform_custom_domain_verification.<name>.hostname so that the worker's reservation waits for it. The origin is https://<hostname>."
  type        = string
  default     = null
}

variable "offering_id" {
  description = "The module-worker offering to run on; null when the organization is sold exactly one."
  type        = string
  default     = null
}

variable "vars" {
  description = "Plain-text variables by binding name (configuration, not secrets: the plan shows them)."
  type        = map(string)
  default     = null
}

variable "json_vars" {
  description = "JSON variables by binding name, each a JSON text (jsonencode(...)); the worker reads them parsed."
  type        = map(string)
  default     = null
}

variable "compatibility_flags" {
  description = "Compatibility flags beside compatibility_date, such as nodejs_compat."
  type        = set(string)
  default     = null
}

variable "crons" {
  description = "Cron triggers, five-field expressions in UTC (\"*/5 * * * *\"): the worker's scheduled handler runs at each tick. Only offerings with a cron_delivery (takoform_offerings) take them."
  type        = set(string)
  default     = null
}

variable "service_bindings" {
  description = "Other workers this one calls, by binding name: their worker_id (for example module.auth.worker_id). The worker calls env.NAME.fetch(request). Replacing a bound worker replaces this one too."
  type        = map(string)
  default     = null
}

variable "limits" {
  description = "The worker's own limits within its offering's ceilings: cpu_ms (request time on selfhost, CPU time on Cloudflare) and memory_mb (selfhost; 128 on Cloudflare)."
  type = object({
    cpu_ms    = optional(number)
    memory_mb = optional(number)
  })
  default = null
}
