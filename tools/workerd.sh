#!/usr/bin/env bash
# Installs the pinned workerd (the npm package pinned in tools/workerd/package-lock.json) and prints
# the binary's path. `npm ci` installs exactly the locked versions into a cache outside the clone, so
# every clone on this machine shares it; install scripts are skipped because the binary we need ships
# inside the platform package (@cloudflare/workerd-linux-64) and nothing is downloaded from anywhere
# but the npm registry. The binary is then linked into .tools/bin, where the runtime node looks for it.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
pin="$root/tools/workerd"
version="$(sed -n 's/^[[:space:]]*"workerd": "\([^"]*\)".*/\1/p' "$pin/package.json" | head -n1)"
[ -n "$version" ] || { echo "no workerd version pinned in $pin/package.json" >&2; exit 1; }

case "$(uname -s)-$(uname -m)" in
  Linux-x86_64) platform=linux-64 ;;
  Linux-aarch64 | Linux-arm64) platform=linux-arm64 ;;
  Darwin-x86_64) platform=darwin-64 ;;
  Darwin-arm64) platform=darwin-arm64 ;;
  *) echo "workerd is not published for $(uname -s) $(uname -m)" >&2; exit 1 ;;
esac

cache="${TAKOFORM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/takoform}/workerd-$version"
bin="$cache/node_modules/@cloudflare/workerd-$platform/bin/workerd"

# The lock file's digest marks a finished install, so an edited pin or a half-finished one reinstalls.
stamp="$cache/.installed-$(sha256sum "$pin/package-lock.json" | cut -c1-16)"
if [ ! -x "$bin" ] || [ ! -f "$stamp" ]; then
  command -v npm >/dev/null 2>&1 || { echo "npm is needed to install workerd $version (install Node.js 18 or later)" >&2; exit 1; }
  echo "installing workerd $version with npm ci (once per machine)" >&2
  rm -rf "$cache"
  mkdir -p "$cache"
  cp "$pin/package.json" "$pin/package-lock.json" "$cache/"
  (cd "$cache" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  [ -x "$bin" ] || { echo "npm ci finished but $bin is missing (is @cloudflare/workerd-$platform in the lock?)" >&2; exit 1; }
  "$bin" --version >/dev/null
  touch "$stamp"
fi

mkdir -p "$root/.tools/bin"
ln -sf "$bin" "$root/.tools/bin/workerd"
echo "$root/.tools/bin/workerd"
