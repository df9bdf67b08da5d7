#!/usr/bin/env bash
# make demo: start `takoserver dev` (the Host and a runtime node), show the Host answering with a
# real key, install the provider from a local mirror, `tofu init && tofu apply` examples/quickstart
# (the full graph: reservation, sealed runtime input, worker, endpoint, activation), fetch its URL
# (the worker shows its secret by length and digest), show an empty re-plan and the ownership
# protocol on a reservation, destroy (the URL then answers 404), and stop the Host (which stops its
# workerd processes and its PostgreSQL cluster).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
listen="${TAKOFORM_DEMO_LISTEN:-127.0.0.1:8080}"
version="${VERSION:-0.1.0}"
devdir="$root/.takoform/dev"
work="$root/.takoform/demo"
secret="hello from a sealed secret" # examples/quickstart's default greeting

# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"
need_tools curl jq
[ -x "$tofu" ] || { echo "no OpenTofu at $tofu: run tools/opentofu.sh" >&2; exit 1; }
[ -x "$root/bin/takoserver" ] && [ -x "$root/bin/terraform-provider-takoform" ] || { echo "run make build first" >&2; exit 1; }

rm -rf "$work"
mkdir -p "$work"

step "starting takoserver dev on $listen (PostgreSQL cluster in $devdir, a runtime node with workerd)"
"$root/bin/takoserver" dev --dir "$devdir" --listen "$listen" >"$work/takoserver.out" 2>"$work/takoserver.log" &
host_pid=$!
stop_host() {
  if kill -0 "$host_pid" 2>/dev/null; then
    step "stopping takoserver dev"
    kill -INT "$host_pid"
    wait "$host_pid" || true
  fi
}
trap stop_host EXIT

wait_ready "http://$listen/readyz" "$host_pid" "$work/takoserver.log"
cat "$work/takoserver.out"

# shellcheck disable=SC1091
source "$devdir/env"
auth=(-H "Authorization: Bearer $TAKOFORM_API_KEY")

step "the Host answers with the dev organization's key: GET /v1/capabilities"
curl -fsS "${auth[@]}" "$TAKOFORM_ENDPOINT/v1/capabilities" | jq .

step "and refuses a request without one"
curl -sS "$TAKOFORM_ENDPOINT/v1/capabilities" | jq .

step "installing the provider from a local mirror and running tofu init && tofu apply on examples/quickstart"
provider_mirror "$version"
cp -R "$root/examples/quickstart" "$work/quickstart"
(cd "$work/quickstart" && "$tofu" init -input=false -no-color && "$tofu" apply -auto-approve -input=false -no-color)

step "tofu output: the URL, the origin reserved before anything existed, and the secret's reference (a digest, never the value)"
(cd "$work/quickstart" && "$tofu" output -no-color)
url="$(cd "$work/quickstart" && "$tofu" output -raw url)"

step "fetching $url: the worker runs in workerd behind the runtime node's edge"
reply="$(curl -sS --fail-with-body --max-time 10 "$url")" || { echo "the URL did not answer: $reply" >&2; exit 1; }
echo "the worker answered: $reply"
want="$(printf '%s' "$secret" | sha256sum | cut -d' ' -f1)"
case "$reply" in
  *"has ${#secret} characters, SHA-256 $want."*) echo "that is the length and SHA-256 of the secret passed to tofu apply: it was delivered, sealed, to the runtime" ;;
  *) echo "the worker did not report the secret passed to tofu apply" >&2; exit 1 ;;
esac

step "the worker's log at its logs_url: the line it printed for that request, never its secret"
logs_url="$(cd "$work/quickstart" && "$tofu" output -raw logs_url)"
logs="$(curl -sS --fail-with-body --max-time 10 "${auth[@]}" "$logs_url")" || { echo "the logs URL did not answer: $logs" >&2; exit 1; }
echo "$logs"
case "$logs" in
  *'"level":"log","message":"GET /"'*) ;;
  *) echo "the worker's console.log line is not in its log" >&2; exit 1 ;;
esac
if grep -qF "$secret" <<<"$logs"; then
  echo "the secret is in the worker's log!" >&2
  exit 1
fi

step "tofu plan again: nothing to change"
(cd "$work/quickstart" && "$tofu" plan -input=false -no-color -detailed-exitcode)
echo "re-plan is empty"

step "nothing secret in the state: the secret's value is absent, only its reference is there"
if grep -qF "$secret" "$work/quickstart/terraform.tfstate"; then
  echo "the secret is in the state file!" >&2
  exit 1
fi
grep -o '"reference": "[^"]*"' "$work/quickstart/terraform.tfstate"

step "the ownership protocol on a reservation: create, replay, delete, late replay"
token="demo-$(date +%s)-$RANDOM-token"
put() {
  curl -sS -o "$work/body" -D "$work/headers" -X PUT "${auth[@]}" \
    -H "Takoform-Ownership-Token: $token" -H 'Content-Type: application/json' \
    -d '{"space":"demo","workerName":"ownership"}' "$TAKOFORM_ENDPOINT/v1/worker-endpoint-origin-reservations/res-demo-ownership"
  printf '%s %s\n' "$(head -1 "$work/headers" | tr -d '\r')" "$(grep -i '^takoform-replayed' "$work/headers" | tr -d '\r' || true)"
  jq -c . "$work/body"
}
put
put
curl -fsS -X DELETE "${auth[@]}" -H "Takoform-Ownership-Token: $token" \
  "$TAKOFORM_ENDPOINT/v1/worker-endpoint-origin-reservations/res-demo-ownership" | jq -c .
put

step "tofu destroy: activation, endpoint, worker, runtime input, reservation, in the order the Host accepts"
(cd "$work/quickstart" && "$tofu" destroy -auto-approve -input=false -no-color)

step "the destroyed endpoint no longer answers at $url"
code="$(curl -sS -o "$work/body" -w '%{http_code}' --max-time 10 "$url")"
echo "HTTP $code: $(jq -c . "$work/body")"
[ "$code" = 404 ] || { echo "the URL still answers after destroy" >&2; exit 1; }

stop_host
trap - EXIT
step "demo finished: the quickstart applied, answered at its URL with its secret, re-planned empty and was destroyed against a real Host; the dev cluster stopped cleanly"
