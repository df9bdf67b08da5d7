#!/usr/bin/env bash
# Lints api/openapi.yaml with the pinned @redocly/cli (tools/redocly/package-lock.json), installed
# with npm ci on first use into tools/redocly/node_modules. make lint runs it; on a fresh machine
# it needs only node and npm (apt-get install nodejs npm).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dir="$root/tools/redocly"
command -v npm >/dev/null || { echo "tools/redocly.sh needs node and npm (apt-get install -y nodejs npm)" >&2; exit 1; }
major="$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)"
[ "$major" -ge 20 ] || { echo "tools/redocly.sh needs Node.js 20.19 or later (the pinned @redocly/cli says so); this is $(node --version 2>/dev/null || echo 'no node')" >&2; exit 1; }
if [ ! -x "$dir/node_modules/.bin/redocly" ]; then
  (cd "$dir" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
fi
cd "$root/api"
NO_UPDATE_NOTIFIER=1 REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true \
  "$dir/node_modules/.bin/redocly" lint openapi.yaml --format=stylish
