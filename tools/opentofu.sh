#!/usr/bin/env bash
# Builds the pinned OpenTofu from its module on the Go module proxy and prints the binary's path.
# The module's go.mod carries a replace directive, so it cannot be built with `go install`; we
# download it, copy it somewhere writable and run `go build ./cmd/tofu` there. The result is cached
# outside the clone (so every clone on this machine shares it) and linked into .tools/bin.
set -euo pipefail

version="${TAKOFORM_OPENTOFU_VERSION:-v1.12.6}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TAKOFORM_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/takoform}"
bin="$cache/opentofu-$version-release/tofu"

if [ ! -x "$bin" ]; then
  echo "building OpenTofu $version (a few minutes, once per machine)" >&2
  work="$(mktemp -d)"
  trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
  dir="$(cd "$work" && GOFLAGS=-mod=mod go mod download -json "github.com/opentofu/opentofu@$version" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [ -n "$dir" ] || { echo "could not download github.com/opentofu/opentofu@$version" >&2; exit 1; }
  cp -R "$dir" "$work/src"
  chmod -R u+w "$work/src"
  mkdir -p "$(dirname "$bin")"
  (cd "$work/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/opentofu/opentofu/version.dev=no" -o "$bin.tmp" ./cmd/tofu)
  mv "$bin.tmp" "$bin"
fi

mkdir -p "$root/.tools/bin"
ln -sf "$bin" "$root/.tools/bin/tofu"
echo "$root/.tools/bin/tofu"
