#!/usr/bin/env bash
# Regenerates docs/ from templates/, examples/ and the provider's schema. The schema comes from the
# pinned OpenTofu running the freshly built provider through dev_overrides, so no Terraform download
# is needed. CI runs this and fails when docs/ changes.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

cat >"$work/cli.tfrc" <<RC
provider_installation {
  dev_overrides {
    "takoform/takoform" = "$root/bin"
  }
  direct {}
}
RC
cat >"$work/main.tf" <<'TF'
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}
TF
(cd "$work" && TF_CLI_CONFIG_FILE="$work/cli.tfrc" CHECKPOINT_DISABLE=1 "$tofu" providers schema -json 2>/dev/null) |
  jq '.provider_schemas |= with_entries(.key |= sub(".*/takoform/takoform$"; "takoform"))' >"$work/schema.json"

cd "$root"
go tool tfplugindocs generate --provider-name takoform --rendered-provider-name Takoform \
  --providers-schema "$work/schema.json"
