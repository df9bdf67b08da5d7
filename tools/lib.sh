# Shared by the demo scripts (tools/demo.sh, tools/demo-cloudflare.sh) and tools/bench-provider.sh:
# source it after setting root (the repository) and work (the run's directory).

# step prints a heading for what the script does next.
step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

# need_tools fails unless every named command is on PATH.
need_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || { echo "$(basename "$0") needs $tool (apt-get install -y $tool)" >&2; exit 1; }
  done
}

# wait_ready URL PID LOG waits until URL answers, and fails (printing LOG) when process PID exits
# first or a minute passes.
wait_ready() {
  local url="$1" pid="$2" log="$3"
  for _ in $(seq 1 120); do
    curl -fsS "$url" >/dev/null 2>&1 && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; echo "the process behind $url exited" >&2; exit 1; }
    sleep 0.5
  done
  curl -fsS "$url" >/dev/null
}

# provider_mirror VERSION installs bin/terraform-provider-takoform into a filesystem mirror under
# $work, as a user installs a release, and points the CLIs at it (TF_CLI_CONFIG_FILE).
provider_mirror() {
  local version="$1" host dir
  for host in registry.opentofu.org registry.terraform.io; do
    dir="$work/mirror/$host/takoform/takoform/$version/linux_amd64"
    mkdir -p "$dir"
    cp "$root/bin/terraform-provider-takoform" "$dir/terraform-provider-takoform_v$version"
  done
  cat >"$work/cli.tfrc" <<RC
provider_installation {
  filesystem_mirror {
    path    = "$work/mirror"
    include = ["registry.opentofu.org/takoform/takoform", "registry.terraform.io/takoform/takoform"]
  }
  direct {
    exclude = ["registry.opentofu.org/takoform/takoform", "registry.terraform.io/takoform/takoform"]
  }
}
RC
  export TF_CLI_CONFIG_FILE="$work/cli.tfrc" TF_IN_AUTOMATION=1 CHECKPOINT_DISABLE=1
}
