#!/usr/bin/env bash
# make demo-domain: a worker on a custom domain (SPEC 3.7). A local DNS server stands in for the
# user's DNS host and a private CA for the edge's certificate authority (tools/demodomain).
# `takoserver dev` runs with --dns-resolver pointing at that DNS server and its edge on HTTPS with
# a certificate for the demo's names. The demo claims app.example.com with OpenTofu, publishes the
# claim's TXT record, applies examples/custom-domain (the verification waits for the Host's check),
# fetches https://app.example.com/ through the edge trusting only the demo CA, and destroys in order.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
listen="${TAKOFORM_DEMO_LISTEN:-127.0.0.1:8080}"
edge="${TAKOFORM_DEMO_EDGE:-127.0.0.1:8787}"
version="${VERSION:-0.1.0}"
devdir="$root/.takoform/dev-domain"
work="$root/.takoform/demo-domain"
hostname="app.example.com"

# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"
need_tools curl jq
[ -x "$tofu" ] || { echo "no OpenTofu at $tofu: run tools/opentofu.sh" >&2; exit 1; }
[ -x "$root/bin/takoserver" ] && [ -x "$root/bin/terraform-provider-takoform" ] || { echo "run make build first" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -INT "$pid"
      wait "$pid" || true
    fi
  done
}
trap cleanup EXIT

step "a DNS server and a private CA standing in for the world (tools/demodomain)"
(cd "$root" && go build -o "$work/demodomain" ./tools/demodomain)
"$work/demodomain" -dir "$work/pki" -hosts "$hostname,*.workers.localhost" >"$work/demodomain.out" 2>"$work/demodomain.log" &
pids+=($!)
for _ in $(seq 1 50); do [ -s "$work/demodomain.out" ] && break; sleep 0.1; done
read -r dns control < <(sed -e 's/dns=//' -e 's/control=//' "$work/demodomain.out")
echo "DNS server at $dns, its control at $control"

step "starting takoserver dev on $listen, resolving through $dns, its edge on HTTPS at $edge"
"$root/bin/takoserver" dev --dir "$devdir" --listen "$listen" --edge-listen "$edge" --dns-resolver "$dns" \
  --edge-tls-cert "$work/pki/edge.pem" --edge-tls-key "$work/pki/edge-key.pem" \
  >"$work/takoserver.out" 2>"$work/takoserver.log" &
host_pid=$!
pids=("$host_pid" "${pids[@]}")
wait_ready "http://$listen/readyz" "$host_pid" "$work/takoserver.log"
# shellcheck disable=SC1091
source "$devdir/env"
auth=(-H "Authorization: Bearer $TAKOFORM_API_KEY")

step "the offerings: the selfhost worker offering serves custom domains, pointed at its edge"
curl -fsS "${auth[@]}" "$TAKOFORM_ENDPOINT/v1/offerings" | jq -c '.offerings[] | select(.customDomains) | {id, customDomains}'

provider_mirror "$version"
mkdir -p "$work/examples/modules"
cp -R "$root/examples/custom-domain" "$work/examples/custom-domain"
cp -R "$root/examples/modules/worker" "$work/examples/modules/worker"
cd "$work/examples/custom-domain"

step "tofu apply -target=takoform_custom_domain.app: the claim, created pending with the records to publish"
"$tofu" init -input=false -no-color >/dev/null
"$tofu" apply -auto-approve -input=false -no-color -target=takoform_custom_domain.app
"$tofu" output -no-color records

step "publishing the TXT record at the (stand-in) DNS host, as the user would"
txt_name="$("$tofu" output -raw txt_name)"
curl -fsS -X PUT --data-binary "$("$tofu" output -raw txt_value)" "$control/txt/$txt_name"
echo "published TXT $txt_name"

step "tofu apply: the verification waits for the Host's lookup, then the worker is deployed on https://$hostname/"
"$tofu" apply -auto-approve -input=false -no-color
url="$("$tofu" output -raw url)"
[ "$url" = "https://$hostname/" ] || { echo "the worker's URL is $url, not https://$hostname/" >&2; exit 1; }

step "the claim as the Host shows it"
curl -fsS "${auth[@]}" "$TAKOFORM_ENDPOINT/v1/custom-domains/$hostname" | jq '{hostname, status, verifiedAt, conditions}'

step "fetching $url over HTTPS through the edge, trusting only the demo CA (--connect-to stands in for DNS's A record)"
reply="$(curl -sS --fail-with-body --max-time 10 --cacert "$work/pki/ca.pem" --connect-to "$hostname:443:$edge" "$url")"
echo "the worker answered: $reply"
[ "$reply" = "hello from $hostname" ] || { echo "unexpected answer" >&2; exit 1; }

step "another organization cannot claim the name: 409 domain_taken, naming nobody"
"$root/bin/takoserver" orgs create globex >/dev/null
other_key="$("$root/bin/takoserver" --output json keys create --org globex | jq -r .key)"
curl -sS -X PUT -H "Authorization: Bearer $other_key" -H "Takoform-Ownership-Token: demo-globex-token-0001" \
  -H 'Content-Type: application/json' -d '{}' "$TAKOFORM_ENDPOINT/v1/custom-domains/$hostname" | jq -c '{status, code, detail}'

step "tofu destroy: the worker's graph in order, then the claim"
"$tofu" destroy -auto-approve -input=false -no-color
code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 --cacert "$work/pki/ca.pem" --connect-to "$hostname:443:$edge" "$url" || true)"
echo "after destroy, $url answers HTTP $code"
[ "$code" = 404 ] || { echo "the URL still answers after destroy" >&2; exit 1; }

cd "$root"
cleanup
trap - EXIT
step "demo finished: $hostname was claimed, verified through DNS, served over HTTPS and let go, against a real Host"
