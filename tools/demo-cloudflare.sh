#!/usr/bin/env bash
# make demo-cloudflare: the quickstart on the two Cloudflare packs, against the Cloudflare API
# stand-in (tools/cfstandin) instead of an account. It starts the stand-in, writes a catalog that
# sells a workers-dev and a wfp-managed installation on it beside the dev selfhost node, starts
# `takoserver dev` with that catalog, installs the dispatch worker, applies examples/cloudflare on
# each offering, fetches the worker's https:// URL through the stand-in's edge (the hostname
# resolved to it, its CA trusted), re-plans empty, destroys, and sees the URL answer 404. A
# deleted route counts as gone only after the installation's routePropagationSeconds (the
# dispatch worker caches routes for 60 s), so the wfp-managed destroy waits that long for its
# reservation's release.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
listen="${TAKOFORM_DEMO_LISTEN:-127.0.0.1:8080}"
cf_listen="${TAKOFORM_DEMO_CF_LISTEN:-127.0.0.1:8790}"
version="${VERSION:-0.1.0}"
devdir="$root/.takoform/dev-cloudflare"
work="$root/.takoform/demo-cloudflare"
secret="hello from a sealed secret" # examples/cloudflare's default greeting

# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"
need_tools curl jq
[ -x "$tofu" ] || { echo "no OpenTofu at $tofu: run tools/opentofu.sh" >&2; exit 1; }
for b in takoserver terraform-provider-takoform cfstandin; do
  [ -x "$root/bin/$b" ] || { echo "run make build first (bin/$b is missing)" >&2; exit 1; }
done

# The stand-in keeps its state in memory, so the Host starts afresh beside it each run.
rm -rf "$work" "$devdir" "$root/.takoform/runtime-cloudflare"
mkdir -p "$work"
chmod 700 "$work"

pids=()
stop_all() {
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -INT "$pid"
      wait "$pid" || true
    fi
  done
}
trap stop_all EXIT

step "starting the Cloudflare API stand-in on $cf_listen (uploaded scripts run in workerd behind its edge)"
"$root/bin/cfstandin" --listen "$cf_listen" --state-dir "$work/cf" --kv-stale 5s >"$work/cfstandin.env" 2>"$work/cfstandin.log" &
pids+=($!)
for _ in $(seq 1 100); do
  grep -q '^CFSTANDIN_BASE_DOMAIN=' "$work/cfstandin.env" 2>/dev/null && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$work/cfstandin.log" >&2; echo "cfstandin exited" >&2; exit 1; }
  sleep 0.2
done
# shellcheck disable=SC1091
source "$work/cfstandin.env"
cat "$work/cfstandin.env"

step "a catalog selling selfhost, workers-dev and wfp-managed offerings"
jq -n --arg api "$CFSTANDIN_API_BASE_URL" --arg token "$CFSTANDIN_TOKEN_FILE" --arg account "$CFSTANDIN_ACCOUNT_ID" \
  --arg sub "$CFSTANDIN_ACCOUNT_SUBDOMAIN" --arg ns "$CFSTANDIN_DISPATCH_NAMESPACE" --arg kv "$CFSTANDIN_ROUTING_KV_NAMESPACE" \
  --arg base "$CFSTANDIN_BASE_DOMAIN" --arg rt "$root/.takoform/runtime-cloudflare/admin-token" '{
  installations: [
    {name: "selfhost", pack: "selfhost", endpointSuffix: "workers.localhost", edgeListen: "127.0.0.1:8787", scheme: "http",
     runtimeUrl: "http://127.0.0.1:8788", runtimeTokenFile: $rt},
    {name: "cloudflare-workers-dev", pack: "workers-dev", accountId: $account, apiTokenFile: $token, apiBaseUrl: $api,
     accountSubdomain: $sub, routePropagationSeconds: 5},
    {name: "cloudflare-wfp", pack: "wfp-managed", accountId: $account, apiTokenFile: $token, apiBaseUrl: $api,
     baseDomain: $base, dispatchNamespace: $ns, dispatchWorkerName: "takoform-dispatch", routingKvNamespaceId: $kv,
     routePropagationSeconds: 60}
  ],
  offerings: [
    {id: "selfhost-module-worker", kind: "module-worker", installation: "selfhost", soldTo: ["*"]},
    {id: "selfhost-worker-endpoint", kind: "worker-endpoint", installation: "selfhost", soldTo: ["*"]},
    {id: "cloudflare-workers-dev", kind: "module-worker", installation: "cloudflare-workers-dev", soldTo: ["*"]},
    {id: "cloudflare-workers-dev-endpoint", kind: "worker-endpoint", installation: "cloudflare-workers-dev", soldTo: ["*"]},
    {id: "cloudflare-wfp", kind: "module-worker", installation: "cloudflare-wfp", soldTo: ["*"]},
    {id: "cloudflare-wfp-endpoint", kind: "worker-endpoint", installation: "cloudflare-wfp", soldTo: ["*"]}
  ]}' >"$work/catalog.json"
chmod 600 "$work/catalog.json"
jq -c '.offerings[] | {id, installation}' "$work/catalog.json"

step "installing the wfp-managed dispatch worker: takoserver cloudflare install-dispatch"
"$root/bin/takoserver" cloudflare install-dispatch --config "$work/catalog.json" --installation cloudflare-wfp

step "starting takoserver dev on $listen with that catalog (its wfp-managed Ready probe goes to the stand-in's edge)"
"$root/bin/takoserver" dev --dir "$devdir" --runtime-state-dir "$root/.takoform/runtime-cloudflare" --listen "$listen" \
  --config "$work/catalog.json" --cloudflare-edge "$CFSTANDIN_EDGE_ADDR" --cloudflare-edge-ca "$CFSTANDIN_EDGE_CA_FILE" \
  >"$work/takoserver.out" 2>"$work/takoserver.log" &
pids+=($!)
wait_ready "http://$listen/readyz" "${pids[1]}" "$work/takoserver.log"
# shellcheck disable=SC1091
source "$devdir/env"

provider_mirror "$version"
mkdir -p "$work/examples/modules"
cp -R "$root/examples/modules/worker" "$work/examples/modules/worker"

# fetch URL: through the stand-in's edge, the URL's hostname resolved to it and its CA trusted.
fetch() {
  local url="$1" host port
  host="$(sed -E 's#^https?://([^/:]+).*#\1#' <<<"$url")"
  port="${CFSTANDIN_EDGE_ADDR##*:}"
  curl -sS -o "$work/body" -w '%{http_code}' --max-time 10 --cacert "$CFSTANDIN_EDGE_CA_FILE" \
    --connect-to "$host:443:127.0.0.1:$port" "$url"
}

want="$(printf '%s' "$secret" | sha256sum | cut -d' ' -f1)"
for offering in cloudflare-workers-dev cloudflare-wfp; do
  dir="$work/examples/$offering"
  cp -R "$root/examples/cloudflare" "$dir"

  step "$offering: tofu init && tofu apply -var offering_id=$offering"
  (cd "$dir" && "$tofu" init -input=false -no-color >/dev/null && "$tofu" apply -auto-approve -input=false -no-color -var "offering_id=$offering")
  url="$(cd "$dir" && "$tofu" output -raw url)"

  step "$offering: fetching $url through the stand-in's edge"
  code=""
  for _ in $(seq 1 40); do
    code="$(fetch "$url")" || true
    [ "$code" = 200 ] && break
    sleep 0.5
  done
  reply="$(cat "$work/body")"
  echo "HTTP $code: $reply"
  case "$reply" in
    *"has ${#secret} characters, SHA-256 $want."*) echo "that is the length and SHA-256 of the secret passed to tofu apply: it reached the script as a secret_text binding" ;;
    *) echo "the worker did not report the secret passed to tofu apply" >&2; exit 1 ;;
  esac

  step "$offering: tofu plan again: nothing to change"
  (cd "$dir" && "$tofu" plan -input=false -no-color -detailed-exitcode -var "offering_id=$offering")

  step "$offering: tofu destroy"
  (cd "$dir" && "$tofu" destroy -auto-approve -input=false -no-color -var "offering_id=$offering")
  for _ in $(seq 1 40); do
    code="$(fetch "$url")" || true
    [ "$code" = 404 ] && break
    sleep 0.5
  done
  echo "HTTP $code at $url after destroy"
  [ "$code" = 404 ] || { echo "the URL still answers after destroy" >&2; exit 1; }
done

step "the stand-in holds nothing of the demo's workers (only the dispatch worker)"
left="$(curl -fsS -H "Authorization: Bearer $(cat "$CFSTANDIN_TOKEN_FILE")" "${CFSTANDIN_API_BASE_URL%/client/v4/}/__standin/state" |
  jq -c '.result | {scripts: [.scripts[] | {namespace, name}], routing_entries: ([.kv[] | length] | add)}')"
echo "$left"
[ "$left" = '{"scripts":[{"namespace":"","name":"takoform-dispatch"}],"routing_entries":0}' ] || { echo "the stand-in holds more than the dispatch worker" >&2; exit 1; }

stop_all
trap - EXIT
step "demo finished: the quickstart applied on workers-dev and wfp-managed through Cloudflare's Go SDK, answered at its https:// URL with its secret, re-planned empty and was destroyed"
