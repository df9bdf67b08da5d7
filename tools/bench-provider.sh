#!/usr/bin/env bash
# make bench-provider: times `tofu apply`, a no-op `tofu plan` and `tofu destroy` of STACKS full
# stacks (reservation, runtime input, worker, endpoint, activation: 5 resources each) against a
# `takoserver dev` Host at OpenTofu's default parallelism (the no-op plan PLANS times, 5 unless told,
# in turn with each floor's, and the median ratio kept), the same graph on the zero-work provider
# (tools/zeroprovider: the Takoform resources' shapes and no work, the floor any framework provider
# of these shapes pays) and the same graph shape built from terraform_data, and prints the ratios. It also counts intent_in_progress answers: those the
# provider retried behind the scenes (the Host's 409 answers, from its /metrics) and those that
# surfaced to the user, and the requests the per-key rate refused (each a Retry-After wait).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
stacks="${STACKS:-20}"
listen="${TAKOFORM_BENCH_LISTEN:-127.0.0.1:8090}"
work="$root/.takoform/bench"
devdir="$work/dev"

[ -x "$tofu" ] || { echo "no OpenTofu at $tofu: run tools/opentofu.sh" >&2; exit 1; }
[ -x "$root/bin/takoserver" ] && [ -x "$root/bin/terraform-provider-takoform" ] || { echo "run make build first" >&2; exit 1; }
# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"
need_tools curl jq

rm -rf "$work"
mkdir -p "$work/takoform" "$work/zero" "$work/data" "$work/zerobin"
(cd "$root" && go build -o "$work/zerobin/terraform-provider-zerowork" ./tools/zeroprovider)
"$root/bin/takoserver" dev --dir "$devdir" --listen "$listen" >"$work/takoserver.out" 2>"$work/takoserver.log" &
host_pid=$!
trap 'kill -INT "$host_pid" 2>/dev/null; wait "$host_pid" 2>/dev/null || true' EXIT
wait_ready "http://$listen/readyz" "$host_pid" "$work/takoserver.log"
# shellcheck disable=SC1091
source "$devdir/env"

cat >"$work/cli.tfrc" <<RC
provider_installation {
  dev_overrides {
    "takoform/takoform" = "$root/bin"
    "takoform/zerowork" = "$work/zerobin"
  }
  direct {}
}
RC
export TF_CLI_CONFIG_FILE="$work/cli.tfrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1

names="$(seq -f 's%02g' 1 "$stacks" | jq -R . | jq -sc .)"
cat >"$work/takoform/main.tf" <<TF
terraform {
  required_providers {
    takoform = { source = "takoform/takoform" }
  }
}

provider "takoform" {}

locals {
  stacks = toset($names)
}

resource "takoform_worker_endpoint_origin_reservation" "r" {
  for_each    = local.stacks
  space       = "bench"
  worker_name = each.key
}

resource "takoform_worker_runtime_input" "ri" {
  for_each                = local.stacks
  space                   = "bench"
  worker_name             = each.key
  endpoint_name           = each.key
  origin_reservation_id   = takoform_worker_endpoint_origin_reservation.r[each.key].id
  canonical_public_origin = takoform_worker_endpoint_origin_reservation.r[each.key].canonical_origin
  bindings_wo             = { TOKEN = "secret-\${each.key}" }
  bindings_wo_version     = 1
}

resource "takoform_worker" "w" {
  for_each                = local.stacks
  space                   = "bench"
  name                    = each.key
  main_module             = "index.js"
  modules                 = { "index.js" = "export default { fetch() { return new Response('ok'); } };" }
  compatibility_date      = "2025-01-01"
  required_sensitive_vars = ["TOKEN"]
  runtime_input_reference = takoform_worker_runtime_input.ri[each.key].reference
}

resource "takoform_worker_endpoint" "e" {
  for_each              = local.stacks
  space                 = "bench"
  name                  = each.key
  worker                = takoform_worker.w[each.key].name
  worker_id             = takoform_worker.w[each.key].id
  origin_reservation_id = takoform_worker_endpoint_origin_reservation.r[each.key].id
}

resource "takoform_worker_endpoint_activation" "a" {
  for_each       = local.stacks
  reservation_id = takoform_worker_endpoint_origin_reservation.r[each.key].id
  endpoint_id    = takoform_worker_endpoint.e[each.key].id
}
TF
# The floor: the same file with the zero-work provider's resources.
sed -e 's/takoform_/zerowork_/g' -e 's/"takoform"/"zerowork"/' -e 's|takoform/takoform|takoform/zerowork|' \
  -e 's/^    takoform = /    zerowork = /' "$work/takoform/main.tf" >"$work/zero/main.tf"

cat >"$work/data/main.tf" <<TF
locals {
  stacks = toset($names)
}

resource "terraform_data" "r" {
  for_each = local.stacks
  input    = each.key
}

resource "terraform_data" "ri" {
  for_each = local.stacks
  input    = terraform_data.r[each.key].output
}

resource "terraform_data" "w" {
  for_each = local.stacks
  input    = terraform_data.ri[each.key].output
}

resource "terraform_data" "e" {
  for_each = local.stacks
  input    = [terraform_data.w[each.key].output, terraform_data.r[each.key].output]
}

resource "terraform_data" "a" {
  for_each = local.stacks
  input    = [terraform_data.r[each.key].output, terraform_data.e[each.key].output]
}
TF

now() { date +%s.%N; }
declare -A took
run() { # run NAME DIR ARGS...: times one tofu command, keeping its output
  local name="$1" dir="$2"
  shift 2
  local start end
  start="$(now)"
  if ! (cd "$dir" && "$tofu" "$@" -input=false -no-color >"$work/$name.out" 2>&1); then
    cat "$work/$name.out" >&2
    echo "bench: $name failed" >&2
    exit 1
  fi
  end="$(now)"
  took[$name]="$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }')"
  printf '%-18s %6.2f s\n' "$name" "${took[$name]}"
}

# pair NAME_A NAME_B DIR_A DIR_B: runs a no-op plan in DIR_A and DIR_B in turn, $plans times, and
# keeps the median of the per-pair ratios (pairing keeps the ratio meaningful when the machine's
# speed drifts; one noisy run does not move a median).
pair() {
  local a="$1" b="$2" da="$3" db="$4" i ratios=()
  for ((i = 0; i < plans; i++)); do
    run "$a" "$da" plan -detailed-exitcode >/dev/null
    run "$b" "$db" plan -detailed-exitcode >/dev/null
    ratios+=("$(awk -v x="${took[$a]}" -v y="${took[$b]}" 'BEGIN { printf "%.4f", x / y }')")
  done
  printf '%s\n' "${ratios[@]}" | sort -n | awk -v n="$plans" '{ r[NR] = $1 } END { printf "%.2f", r[int((n + 1) / 2)] }'
}
plans="${PLANS:-5}"

(cd "$work/data" && "$tofu" init -input=false -no-color >/dev/null)
echo "== $stacks stacks, $((stacks * 5)) resources each side, default parallelism"
run data-apply "$work/data" apply -auto-approve
run zero-apply "$work/zero" apply -auto-approve
answered() { curl -fsS "http://$listen/metrics" | awk -v s="status=\"$1\"" '/^takoserver_http_requests_total/ && index($0, s) { n += $NF } END { print n + 0 }'; }
conflicts() { answered 409; }
before="$(conflicts)"
run takoform-apply "$work/takoform" apply -auto-approve
echo "-- $plans no-op plans each, in turn"
plan_zero="$(pair takoform-plan zero-plan "$work/takoform" "$work/zero")"
plan_data="$(pair takoform-plan data-plan "$work/takoform" "$work/data")"
run takoform-destroy "$work/takoform" destroy -auto-approve
run zero-destroy "$work/zero" destroy -auto-approve
run data-destroy "$work/data" destroy -auto-approve

retried="$(( $(conflicts) - before ))"
surfaced="$(cat "$work"/takoform-*.out | grep -c 'intent_in_progress' || true)"
ratio() { # ratio OP FLOOR
  awk -v op="$1" -v a="${took[takoform-$1]}" -v b="${took[$2-$1]}" 'BEGIN { printf "%-8s %6.2fx  (%.2f s / %.2f s)\n", op, a / b, a, b }'
}
echo
echo "== ratios to the zero-work provider (takoform / zerowork; targets: apply <= 2x, no-op plan <= 1.2x)"
ratio apply zero
printf '%-8s %6sx  (median of %d paired runs)\n' plan "$plan_zero" "$plans"
ratio destroy zero
echo
echo "== ratios to terraform_data (takoform / terraform_data)"
ratio apply data
printf '%-8s %6sx  (median of %d paired runs)\n' plan "$plan_data" "$plans"
ratio destroy data
echo "retryable 409s (intent_in_progress, witness_open): $retried answered and retried by the provider, $surfaced surfaced to the user (target 0)"
echo "rate-limited requests (429 rate_limited, waited out by the provider): $(answered 429)"
[ "$surfaced" -eq 0 ]
