#!/usr/bin/env bash
# make demo-pool: a pool of three runtime nodes behind a local load balancer (nginx), as an
# operator runs one (SPEC 6.2, README "Pools of runtime nodes"). `takoserver dev` runs the Host and
# the pool's first node; two more nodes join with `takoserver nodes add`, get the quickstart's
# worker and its secret from the Host, and serve it; nginx spreads requests over the three edges.
# One node is killed: requests through the load balancer keep being answered. It is retired as
# lost, a new node is added in its place and answers with the secret (from the pool blob the Host
# kept, with no tenant action), and the quickstart is destroyed.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tofu="${TAKOFORM_TOFU:-$root/.tools/bin/tofu}"
workerd="${TAKOFORM_WORKERD:-$root/.tools/bin/workerd}"
listen="${TAKOFORM_DEMO_LISTEN:-127.0.0.1:8080}"
lb="127.0.0.1:8786"
version="${VERSION:-0.1.0}"
devdir="$root/.takoform/dev-pool"
work="$root/.takoform/demo-pool"
secret="hello from a sealed secret" # examples/quickstart's default greeting

# shellcheck source=tools/lib.sh
source "$root/tools/lib.sh"
if ! command -v nginx >/dev/null && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  step "installing nginx, the demo's load balancer"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null
fi
need_tools curl jq nginx
[ -x "$tofu" ] || { echo "no OpenTofu at $tofu: run tools/opentofu.sh" >&2; exit 1; }
[ -x "$root/bin/takoserver" ] && [ -x "$root/bin/terraform-provider-takoform" ] || { echo "run make build first" >&2; exit 1; }
takoserver="$root/bin/takoserver"

rm -rf "$work" "$devdir"
mkdir -p "$work/nginx/tmp"
pids=()
stop_all() {
  [ -f "$work/nginx/nginx.pid" ] && nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -s quit 2>/dev/null || true
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT

step "starting takoserver dev on $listen: the Host, PostgreSQL, and the pool's first node (admin 127.0.0.1:8788, edge 127.0.0.1:8787)"
"$takoserver" dev --dir "$devdir" --listen "$listen" --janitor-every 2s >"$work/takoserver.out" 2>"$work/takoserver.log" &
pids+=($!)
wait_ready "http://$listen/readyz" "${pids[0]}" "$work/takoserver.log"
# shellcheck disable=SC1091
source "$devdir/env"
token_file="$devdir/runtime/admin-token"
pool_public="$(curl -fsS -H "Authorization: Bearer $(cat "$token_file")" http://127.0.0.1:8788/v1/pool | jq -r .publicKey)"

# The nodes commands read the installation from a catalog, as the Host replicas do. This one is
# the dev Host's default installation, with a 5 s fence for the demo (300 s by default).
catalog="$work/catalog.json"
cat >"$catalog" <<JSON
{
  "installations": [{"name": "selfhost", "pack": "selfhost", "runtimeUrl": "http://127.0.0.1:8788",
    "runtimeTokenFile": "$token_file", "edgeListen": "127.0.0.1:8787", "poolPublicKey": "$pool_public", "fenceSeconds": 5}],
  "offerings": [
    {"id": "selfhost-module-worker", "kind": "module-worker", "installation": "selfhost", "soldTo": ["*"]},
    {"id": "selfhost-worker-endpoint", "kind": "worker-endpoint", "installation": "selfhost", "soldTo": ["*"]}
  ]
}
JSON
nodes() { "$takoserver" nodes "$@" --config "$catalog" --installation selfhost; }

# start_node NAME ADMIN_PORT EDGE_PORT starts a runtime node on a new state directory with the
# pool's key and the installation's admin token, as on a new machine.
start_node() {
  local name="$1" admin="$2" edge="$3" dir="$work/$1"
  install -d -m 0700 "$dir" "$dir/state"
  install -m 0600 "$token_file" "$dir/state/admin-token"
  "$takoserver" runtime init-sealing-key --out "$dir/sealing-key" >/dev/null
  "$takoserver" runtime --state-dir "$dir/state" --sealing-key-file "$dir/sealing-key" --pool-key-file "$devdir/pool/pool-key" \
    --workerd "$workerd" --admin-listen "127.0.0.1:$admin" --edge-listen "127.0.0.1:$edge" 2>"$dir/log" &
  pids+=($!)
  eval "pid_${name//-/_}=$!"
  wait_ready "http://127.0.0.1:$admin/healthz" "$!" "$dir/log"
}

step "installing the provider and applying examples/quickstart on the pool of one"
provider_mirror "$version"
cp -R "$root/examples/quickstart" "$work/quickstart"
(cd "$work/quickstart" && "$tofu" init -input=false -no-color >/dev/null && "$tofu" apply -auto-approve -input=false -no-color >/dev/null)
url="$(cd "$work/quickstart" && "$tofu" output -raw url)"
want="$(printf '%s' "$secret" | sha256sum | cut -d' ' -f1)"
echo "the worker's URL: $url"

step "two more nodes join the pool: takoserver nodes add node-2, node-3"
start_node node-2 8798 8797
start_node node-3 8808 8807
nodes add node-2 --url http://127.0.0.1:8798
nodes add node-3 --url http://127.0.0.1:8808

# answers EDGE: the worker's answer at EDGE (host:port), by the worker's own hostname.
answers() { curl -sS --max-time 5 --connect-to "::$1" "$url" 2>&1 || true; }
has_secret() { case "$1" in *"has ${#secret} characters, SHA-256 $want."*) return 0 ;; esac; return 1; }
wait_secret() {
  for _ in $(seq 1 120); do has_secret "$(answers "$1")" && return 0; sleep 0.5; done
  echo "the node at $1 never answered with the secret: $(answers "$1")" >&2
  exit 1
}
wait_serving() {
  for _ in $(seq 1 120); do
    [ "$(nodes list --output json | jq --arg n "$1" -r '.nodes[] | select(.name == $n) | .state')" = serving ] && return 0
    sleep 0.5
  done
  echo "node $1 never read serving" >&2
  nodes list >&2
  exit 1
}
for n in 8797 8807; do wait_secret "127.0.0.1:$n"; done
wait_serving node-2
wait_serving node-3
nodes list
echo "each new node answers with the secret: the Host's janitor wrote it the worker, its route and its kept pool delivery"

write_nginx() {
  {
    echo "worker_processes 1; pid $work/nginx/nginx.pid; error_log $work/nginx/error.log;"
    echo "events {}"
    echo "http {"
    echo "  access_log off;"
    for t in client_body proxy fastcgi uwsgi scgi; do echo "  ${t}_temp_path $work/nginx/tmp/$t;"; done
    echo "  upstream pool {"
    for edge in "$@"; do echo "    server $edge max_fails=1 fail_timeout=10s;"; done
    echo "  }"
    echo "  server {"
    echo "    listen $lb;"
    echo "    location / {"
    echo "      proxy_pass http://pool;"
    echo "      proxy_set_header Host \$http_host;"
    echo "      proxy_next_upstream error timeout http_502 http_503;"
    echo "      proxy_connect_timeout 1s;"
    echo "    }"
    echo "  }"
    echo "}"
  } >"$work/nginx/nginx.conf"
}

step "nginx on $lb in front of the three edges"
write_nginx 127.0.0.1:8787 127.0.0.1:8797 127.0.0.1:8807
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf"
# through_lb N: N requests through the load balancer, each answering with the secret.
through_lb() {
  local ok=0 reply
  for _ in $(seq 1 "$1"); do
    reply="$(answers "$lb")"
    has_secret "$reply" && ok=$((ok + 1))
  done
  echo "$ok of $1 requests through the load balancer answered with the secret"
  [ "$ok" = "$1" ] || { echo "the last answer: $reply" >&2; exit 1; }
}
through_lb 12

step "node-3's machine dies (SIGKILL): the load balancer sends around it"
kill -KILL "$pid_node_3"
killed_at="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
through_lb 12

step "retire node-3 as lost: refused before the pool's fence, then accepted"
nodes retire --lost node-3 --fenced-since "$killed_at" || echo "(refused, as it should be: the fence has not passed)"
sleep 6
nodes retire --lost node-3 --fenced-since "$killed_at" --by demo-operator
nodes list

step "a new node in its place: node-4, on a new machine, added to the pool"
start_node node-4 8818 8817
nodes add node-4 --url http://127.0.0.1:8818
wait_secret 127.0.0.1:8817
wait_serving node-4
echo "node-4 answers with the secret, from the pool blob the Host kept: no tenant action, no new runtime input"
write_nginx 127.0.0.1:8787 127.0.0.1:8797 127.0.0.1:8817
nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -s reload
sleep 1
through_lb 12
nodes list

step "tofu destroy: the worker leaves every node of the pool"
(cd "$work/quickstart" && "$tofu" destroy -auto-approve -input=false -no-color >/dev/null)
for edge in 127.0.0.1:8787 127.0.0.1:8797 127.0.0.1:8817; do
  code="$(curl -sS -o /dev/null -w '%{http_code}' --max-time 5 --connect-to "::$edge" "$url")"
  echo "$edge answers $code"
  [ "$code" = 404 ] || { echo "the destroyed worker still answers at $edge" >&2; exit 1; }
done

stop_all
trap - EXIT
step "demo finished: a pool of three nodes behind nginx served the worker through a node's loss and its replacement"
